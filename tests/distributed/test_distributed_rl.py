"""The RL trainer on two real ranks: ``accelerate launch --multi_gpu --num_processes 2`` on CPU (gloo).

One 2-rank run (2 steps, 2 prompts per rank) checks that DDP keeps the ranks' weights identical, that rank 0
alone writes the run's files, that a rank whose groups are all filtered out still joins the gradient
all-reduce (no hang), that held-out items shard unevenly (3 items on 2 ranks), and that the two ranks together
see exactly the prompts a 1-rank run with 4 prompts per step sees.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import Counter

import pytest
import torch
from two_ranks import free_port, run_ranks

from dllm_rl.config import load_config
from dllm_rl.jsonl import write_jsonl
from dllm_rl.models import build_model, char_tokenizer, load_model, save_model, tiny_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train
from dllm_rl.tasks.synthetic import make_countdown

G = 4  # num_generations
P = 2  # prompts per step per rank
STEPS = 2

# Imported by the child processes (tmp_path is on their PYTHONPATH): a dense reward that records every call.
# On rank 1 the first training batch (groups of G equal prompts) scores a flat 0, so all of rank 1's groups
# are dropped at step 1 while rank 0 keeps all of its own.
REWARD_MODULE = '''
import json, os

_train_calls = 0


def dense(c):
    return sum(ch.isdigit() for ch in c) / max(len(c), 1) + sum(map(ord, c)) % 13 / 100


def reward(prompts, completions, **columns):
    global _train_calls
    rank = int(os.environ.get("RANK", "0"))
    prompts = list(prompts or [])
    training = len(prompts) >= 2 and prompts[0] is not None and prompts[0] == prompts[1]
    with open(os.path.join(os.environ["DIST_TEST_LOG"], f"calls_rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps({"training": training, "n": len(completions), "prompts": prompts}) + "\\n")
    if training:
        _train_calls += 1
        if rank == 1 and _train_calls == 1:
            return [0.0] * len(completions)
    return [dense(c) for c in completions]
'''

# `dllm-rl rl` exactly as `-m dllm_rl rl` runs it, plus each rank's final weights saved for the test.
DRIVER = '''
import sys

import torch

from dllm_rl.cli import main
from dllm_rl.rl import trainer

_save_final = trainer.RLTrainer.save_final_model


def save_final_model(self):
    state = {k: v.detach().cpu().clone() for k, v in self.model.hf_model.state_dict().items()}
    torch.save(state, self.out / f"weights_rank{self.accelerator.process_index}.pt")
    if self.value is not None:
        torch.save(self.value.model.state_dict(), self.out / f"value_rank{self.accelerator.process_index}.pt")
    return _save_final(self)


trainer.RLTrainer.save_final_model = save_final_model
sys.exit(main(sys.argv[1:]))
'''


def _overrides(root, out, prompts_per_step: int) -> list[str]:
    return [f"model.path={root / 'llada'}", "data.task=countdown", f"data.train_file={root / 'train.jsonl'}",
            f"eval.data={root / 'test.jsonl'}", "eval.limit=3", "data.prompt_style=compact",
            f"train.prompts_per_step={prompts_per_step}", f"rollout.num_generations={G}", "rollout.gen_length=8",
            "rollout.block_length=8", f"train.max_steps={STEPS}", "train.micro_batch_size=4", "optim.lr=0.003",
            "model.device=cpu", "run.progress=false", "log.samples_every=0", f"run.output_dir={out}"]


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _training_prompts(calls: list[dict]) -> list[list[str]]:
    """The distinct prompts of each training reward call, in call (= step) order."""
    steps = []
    for call in calls:
        if call["training"]:
            counts = Counter(call["prompts"])
            assert set(counts.values()) == {G}
            steps.append(sorted(counts))
    return steps


def _setup(tmp_path):
    """Data, a tiny LLaDA-shaped checkpoint, and the reward and driver modules the ranks import."""
    root = tmp_path / "data"
    root.mkdir()
    write_jsonl(root / "train.jsonl", make_countdown(32, seed=0, numbers=3, max_value=9))
    write_jsonl(root / "test.jsonl", make_countdown(3, seed=1, numbers=3, max_value=9))
    tok = char_tokenizer()
    cfg = tiny_config("llada", vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, hidden_size=32,
                      intermediate_size=64, num_heads=2, num_kv_heads=1)
    save_model(build_model("llada", cfg, seed=0), root / "llada", tokenizer=tok)
    (tmp_path / "dist_rl_reward.py").write_text(REWARD_MODULE)
    (tmp_path / "dist_rl_driver.py").write_text(DRIVER)
    (tmp_path / "rl.yaml").write_text("algorithm: espo\nreward: dist_rl_reward:reward\n")
    (tmp_path / "logs").mkdir()
    return root


def _launch_two_ranks(tmp_path, overrides: list[str]) -> None:
    """``dllm-rl rl`` under ``accelerate launch`` with 2 CPU ranks; fails the test on an error or a hang."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", HF_HOME=str(tmp_path / "hf"),
               HF_HUB_OFFLINE="1", DIST_TEST_LOG=str(tmp_path / "logs"),
               PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), str(tmp_path / "dist_rl_driver.py"),
           "rl", str(tmp_path / "rl.yaml"), *overrides]
    rc, log = run_ranks(cmd, env, tmp_path, 180, "2-rank run hung (a collective that only some ranks reached?)")
    assert rc == 0, log[-6000:]


def _calls(tmp_path) -> dict[int, list[dict]]:
    """Each rank's reward calls."""
    logs = tmp_path / "logs"
    return {r: [json.loads(x) for x in (logs / f"calls_rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}


def _same_weights_on_both_ranks(out) -> dict:
    w0 = torch.load(out / "weights_rank0.pt", weights_only=True)
    w1 = torch.load(out / "weights_rank1.pt", weights_only=True)
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    return w0


def _dense_recording_reward(seen: list[dict]):
    """The reward module's dense reward in this process, recording its calls like the ranks' log."""
    def reward(prompts, completions, **columns):
        prompts = list(prompts or [])
        training = len(prompts) >= 2 and prompts[0] is not None and prompts[0] == prompts[1]
        seen.append({"training": training, "n": len(completions), "prompts": prompts})
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) + sum(map(ord, c)) % 13 / 100
                for c in completions]
    return reward


@pytest.mark.slow
def test_two_cpu_ranks_stay_in_sync_and_shard_the_prompts(tmp_path):
    root = _setup(tmp_path)

    # --- 2 ranks, P prompts each
    out2 = tmp_path / "two"
    _launch_two_ranks(tmp_path, _overrides(root, out2, P))

    # DDP kept the ranks identical, rank 0 saved exactly that model, and the updates were not zero
    w0 = _same_weights_on_both_ranks(out2)
    final = load_model(out2 / "final").hf_model.state_dict()
    start = load_model(root / "llada").hf_model.state_dict()
    assert all(torch.equal(final[k], w0[k]) for k in final)
    assert sum(not torch.equal(start[k], w0[k]) for k in start) >= len(start) // 2
    ckpt = out2 / "checkpoints" / "step-0000002"
    assert (ckpt / "rng_state_rank0.pt").is_file() and (ckpt / "rng_state_rank1.pt").is_file()
    assert json.loads((ckpt / "trainer_state.json").read_text())["world_size"] == 2

    # metrics.jsonl written once (rank 0): eval before, 2 steps, eval after; rank-averaged values
    rows = _rows(out2)
    assert [r["step"] for r in rows] == [0, 1, 2, 2]
    steps = [r for r in rows if "loss" in r]
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert [r["kept_samples"] for r in steps] == [P * G / 2, P * G]  # step 1: rank 1 dropped both its groups
    assert steps[0]["zero_variance_groups"] == P / 2
    assert rows[0]["eval_reward"] > 0 and "skipped_step" not in steps[0]
    # save_rollouts=4 per step, written by rank 0 only
    assert len((out2 / "rollouts.jsonl").read_text().splitlines()) == STEPS * 4

    # the two ranks split each step's prompt groups; together they are what 1 rank with 2P prompts sees
    calls = _calls(tmp_path)
    per_rank = {r: _training_prompts(calls[r]) for r in (0, 1)}
    assert [len(s) for s in per_rank[0]] == [P] * STEPS and [len(s) for s in per_rank[1]] == [P] * STEPS
    assert all(not set(a) & set(b) for a, b in zip(per_rank[0], per_rank[1]))
    seen_one: list[dict] = []
    out1 = tmp_path / "one"
    train(load_config(RLConfig, None, [*_overrides(root, out1, 2 * P), "algorithm=espo"]),
          reward_fn=_dense_recording_reward(seen_one))
    one_rank = _training_prompts(seen_one)
    assert one_rank == [sorted(a + b) for a, b in zip(per_rank[0], per_rank[1])]
    # held-out evaluation: rank 0 scores items 0 and 2, rank 1 item 1; the reduced mean is the 1-rank mean
    assert [c["n"] for c in calls[0] if not c["training"]] == [2, 2]
    assert [c["n"] for c in calls[1] if not c["training"]] == [1, 1]
    assert rows[0]["eval_reward"] == pytest.approx(_rows(out1)[0]["eval_reward"], abs=1e-6)


@pytest.mark.slow
def test_dynamic_sampling_on_two_ranks_keeps_their_prompt_streams_in_step(tmp_path):
    """Rank 1's first batch has no signal, so it rolls out a second one while rank 0, already full, only draws
    that batch's prompts: both ranks leave step 1 at the same stream position, and step 2 splits the third
    batch between them, as a 1-rank run with 2P prompts per step meets it."""
    root = _setup(tmp_path)
    out2 = tmp_path / "two"
    _launch_two_ranks(tmp_path, [*_overrides(root, out2, P), "dynamic_sampling=true", "max_sampling_rounds=3"])
    _same_weights_on_both_ranks(out2)
    steps = [r for r in _rows(out2) if "loss" in r]
    assert [r["sampling_rounds"] for r in steps] == [1.5, 1.0]  # rank-averaged: (1 + 2) / 2, then 1 each
    assert [r["kept_samples"] for r in steps] == [P * G, P * G]
    assert [r["zero_variance_groups"] for r in steps] == [P / 2, 0]

    per_rank = {r: _training_prompts(c) for r, c in _calls(tmp_path).items()}
    seen_one: list[dict] = []
    out1 = tmp_path / "one"
    train(load_config(RLConfig, None, [*_overrides(root, out1, 2 * P), "algorithm=espo", "train.max_steps=3"]),
          reward_fn=_dense_recording_reward(seen_one))
    batches = _training_prompts(seen_one)  # the stream's first three batches of 2P prompts
    assert [len(s) for s in per_rank[0]] == [P, P] and [len(s) for s in per_rank[1]] == [P, P, P]
    assert sorted(per_rank[0][0] + per_rank[1][0]) == batches[0]
    assert set(per_rank[1][1]) < set(batches[1])  # rank 1's share of the batch rank 0 drew but did not roll out
    assert sorted(per_rank[0][1] + per_rank[1][2]) == batches[2]


@pytest.mark.slow
def test_value_model_on_two_ranks_stays_in_sync(tmp_path):
    """TraceRL with the value model under DDP: rank 1 keeps no sample at step 1 and still joins the value
    model's all-reduces; both ranks end with the same value weights, which moved."""
    root = _setup(tmp_path)
    out2 = tmp_path / "two"
    _launch_two_ranks(tmp_path, [*_overrides(root, out2, P), "algorithm=tracerl", "value_model.enabled=true",
                                 "value_model.lr=0.01", "value_model.micro_batch_size=2"])
    _same_weights_on_both_ranks(out2)
    steps = [r for r in _rows(out2) if "loss" in r]
    assert [r["kept_samples"] for r in steps] == [P * G / 2, P * G]
    assert all(math.isfinite(r["value_loss"]) for r in steps) and steps[0]["value_mean"] == 0.0
    v0, v1 = (torch.load(out2 / f"value_rank{r}.pt", weights_only=True) for r in (0, 1))
    assert all(torch.equal(v0[k], v1[k]) for k in v0) and torch.count_nonzero(v0["head.weight"]) > 0
    state = torch.load(out2 / "checkpoints" / "step-0000002" / "value_model.pt", weights_only=True)["model"]
    assert all(torch.equal(state[k], v0[k]) for k in v0)
