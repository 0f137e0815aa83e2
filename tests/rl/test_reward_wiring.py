"""Reward terms, reward models and judges in RL runs (``reward.terms``, ``reward.model``, ``reward.judge``): built
before any rollout, given the rollout's ids and decoding steps, their process rewards reaching TraceRL's value
model, their metrics logged, their state resumed exactly (tiny models, 1-2 steps)."""

import json

import pytest
import torch
from reward_helpers import JUDGE_TEMPLATE, tiny_llama
from rl_helpers import digit_reward, rl_overrides

import dllm_rl.rl.collect as collect_mod
from dllm_rl.config import load_config
from dllm_rl.errors import UserError
from dllm_rl.rewards.reward_model import RewardModel, RewardModelConfig
from dllm_rl.rl.collect import rollout_columns
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train
from dllm_rl.rl.trainer import RLTrainer

#: TraceRL with its value model; every group trains (the judge's constant fallback would tie some groups)
VALUE = ["algorithm=tracerl", "value_model.enabled=true", "value_model.lr=0.01", "drop_zero_variance=false"]


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("judge") / "judge", "LlamaForCausalLM", chat_template=JUDGE_TEMPLATE,
                      layers=1)


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("rm") / "rm")


def _judge_run(rl_setup, out, judge_dir, *extra):
    """A digit reward plus a process judge scoring every decoding step. The untrained judge writes two characters,
    never a score, so each chunk scores the fallback 0.5 (counted in judge_failures)."""
    judge = ["reward.judge.mode=process", "reward.judge.chunk_by=steps", "reward.judge.chunk_length=1",
             "reward.judge.template={{prompt}}|{{chunk}}", "reward.judge.fallback=0.5",
             "reward.judge.max_new_tokens=2", "reward.judge.device=cpu", "reward.judge.dtype=float32",
             "reward.judge.batch_size=64"]
    terms = f"reward.terms=[{{task: 'rl_helpers:digit_reward'}}, {{judge: '{judge_dir}', weight: 0.5}}]"
    return load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", out, *VALUE, *judge, terms, *extra))


def test_rollout_columns_are_the_answers_ids_and_steps():
    """completion_ids and step_map as a reward receives them: each completion's answer (up to its EOS), the -1 of
    a prefilled token kept; and each completion's forward passes and tokens per forward."""
    from dllm_rl.sampling import Rollout

    ro = Rollout.__new__(Rollout)
    ro.completion_ids = torch.tensor([[5, 6, 2, 2], [7, 8, 9, 2]])
    ro.completion_mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    ro.step_map = torch.tensor([[1, 0, 1, -1], [-1, 0, 2, 1]])
    ro.nfe = torch.tensor([3, 2])
    assert rollout_columns(ro) == {"completion_ids": [[5, 6, 2], [7, 8, 9, 2]],
                                   "step_map": [[1, 0, 1], [-1, 0, 2, 1]], "nfe": [3, 2], "tpf": [1.0, 2.0]}


def test_tracerl_step_with_a_process_judge_feeds_the_value_model_and_caches(rl_setup, tmp_path, judge_dir):
    trainer = RLTrainer(_judge_run(rl_setup, tmp_path, judge_dir, "train.max_steps=2"))
    judge = trainer.reward.terms[1].fn
    asked, generated = [], []
    real_judgements, real_generate = judge.judgements, judge.generate
    judge.judgements = lambda texts, *rest: asked.append(list(texts)) or real_judgements(texts, *rest)
    judge.generate = lambda texts, n, seed: generated.append(list(texts)) or real_generate(texts, n, seed)
    seen, real_targets = [], trainer.value.targets
    trainer.value.targets = lambda batch, rewards, scores: seen.append(scores) or real_targets(batch, rewards, scores)
    batches, real_collect = [], trainer.collect
    trainer.collect = lambda: batches.append(real_collect()) or batches[-1]

    m = trainer.step().metrics
    (batch,), (scores,) = batches, seen
    cols = rollout_columns(batch.rollout)
    digits = digit_reward(None, batch.rollout.texts)
    # per sample: 0.5 x 0.5 on each of its decoding steps, the digit reward (an outcome term) on its last step
    want = []
    for steps, d in zip(cols["step_map"], digits):
        n = len({s for s in steps if s >= 0})
        want.append([0.25] * (n - 1) + [0.25 + d])
    assert [len(s) for s in scores] == [len(w) for w in want] and len(scores) == 8
    assert [v for s in scores for v in s] == pytest.approx([v for w in want for v in w])
    assert batch.reward_values == pytest.approx([sum(w) for w in want])
    # one judge call for the whole rollout batch; each distinct (prompt, chunk) generated once, the rest cached
    (texts,) = asked
    assert len(texts) == sum(len(w) for w in want) and generated == [list(dict.fromkeys(texts))]
    hits = len(texts) - len(set(texts))
    assert hits > 0 and m["judge_cache_hits"] == hits and m["judge_prompts"] == len(set(texts))
    assert m["judge_failures"] == m["judge_prompts"]  # k_sample 1 at temperature 0: one judgement per prompt
    assert m["reward_judge"] == pytest.approx(sum(len(w) for w in want) * 0.5 / 8)
    assert m["reward_digit_reward"] == pytest.approx(sum(digits) / 8)
    assert torch.isfinite(torch.tensor(m["loss"])) and "value_loss" in m
    # the next step generates only prompts no step has judged
    trainer.step()
    _, texts2 = asked
    assert generated[1] == [t for t in dict.fromkeys(texts2) if t not in set(texts)]
    trainer.close()


def test_a_bad_reward_ends_the_run_naming_its_key_before_any_rollout(rl_setup, tmp_path, judge_dir, monkeypatch):
    def no_rollout(*a, **k):
        raise AssertionError("rolled out before the reward was checked")

    monkeypatch.setattr(collect_mod, "generate_batched", no_rollout)
    cases = [
        ([f"reward.terms=[{{task: countdown}}, {{model: '{judge_dir}'}}]"],
         r"^reward.terms\[1\].model: '.*judge' has no classification head \(architectures: LlamaForCausalLM\)"),
        ([f"reward.model={tmp_path / 'nothing'}"], r"^reward.model: cannot load '.*nothing'"),
        ([f"reward.judge.model={tmp_path / 'nothing'}", "reward.judge.device=cpu"],
         r"^reward.judge.model: cannot load '.*nothing' as a causal LM"),
        ([f"reward.judge.model={judge_dir}", "reward.judge.template=rate {{prompt}}"],
         r"^reward.judge.template: the template has no \{\{completion\}\} placeholder"),
        (["reward.terms=[{task: gsm9k}]"], r"^reward.terms\[0\].task: unknown task 'gsm9k'"),
    ]
    for extra, message in cases:
        with pytest.raises(UserError, match=message) as e:
            RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path / "bad", *extra,
                                                               "run.overwrite=true")))
        assert "\n" not in str(e.value)


def test_reward_model_normalisation_resumes_exactly(rl_setup, tmp_path, rm_dir):
    """2 steps straight == 1 step, then a resume from its checkpoint: the reward model's running moments travel
    in the checkpoint, so step 2 normalises its scores as the uninterrupted run did."""
    common = ["algorithm=tracerl", "train.max_steps=2", "run.save_every=1", "train.micro_batch_size=4",
              f"reward.model={rm_dir}", "reward.normalize=true", "reward.device=cpu", "reward.dtype=float32"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", straight, *common)))
    ckpt = straight / "checkpoints" / "step-0000001"
    state = json.loads((ckpt / "trainer_state.json").read_text())["extra"]["reward"]
    assert state["reward_model"]["moments"]["count"] == 8
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", resumed, *common, f"run.resume={ckpt}")))
    a = [m for m in _metrics(straight) if "reward" in m]
    b = [m for m in _metrics(resumed) if "reward" in m]
    assert len(a) == 2 and len(b) == 1
    for key in ("reward", "reward_reward_model", "loss"):
        assert b[0][key] == a[1][key]
    # the logged raw scores are the reward model's own, and step 2's normalisation saw both steps' 16 scores
    final = json.loads((straight / "checkpoints" / "step-0000002" / "trainer_state.json").read_text())["extra"]
    assert final["reward"]["reward_model"]["moments"]["count"] == 16


def test_reward_model_terms_score_what_a_direct_call_scores(rl_setup, tmp_path, rm_dir):
    """The trainer's reward model term receives the prompts and completions it rolled out; its logged metric is
    the mean of its raw scores on them."""
    trainer = RLTrainer(load_config(RLConfig, None, rl_overrides(
        rl_setup, "sdar", tmp_path, "algorithm=tracerl", "train.max_steps=1", f"reward.model={rm_dir}",
        "reward.device=cpu", "reward.dtype=float32", "drop_zero_variance=false")))
    batches, real_collect = [], trainer.collect
    trainer.collect = lambda: batches.append(real_collect()) or batches[-1]
    m = trainer.step().metrics
    (batch,) = batches
    direct = RewardModel(RewardModelConfig(model=str(rm_dir), device="cpu", dtype="float32"))(
        batch.prompts, batch.rollout.texts)
    assert batch.reward_values == pytest.approx(direct, abs=1e-5)
    assert m["reward_reward_model"] == pytest.approx(sum(direct) / len(direct), abs=1e-5)
    trainer.close()
