"""``dllm-rl dpo`` (VRPO, arXiv 2505.19223): the loss on a hand-computed case, the shared masks of the policy and
the reference, independent masks for chosen and rejected, the pairs' data, and tiny end-to-end runs with resume."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dllm_rl.cli import main
from dllm_rl.config import load_config
from dllm_rl.dpo.config import DPOConfig
from dllm_rl.dpo.loss import dpo_loss
from dllm_rl.dpo.trainer import REJECTED_STREAM, DPOTrainer
from dllm_rl.errors import UserError
from dllm_rl.seeding import derive_seed

ROWS = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(4) for b in range(3)]


def _cfg(tmp_path, *overrides, rows=ROWS, name="run"):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["model.tokenizer=char", "model.alphabet=0123456789+=", "model.hidden_size=32", "model.num_layers=2",
            "model.num_heads=2", "model.num_kv_heads=2", "model.intermediate_size=64", f"data.train_file={data}",
            "train.micro_batch_size=4", "train.max_steps=3", "run.progress=false", f"run.output_dir={tmp_path / name}",
            "train.log_every=1", "optim.lr=1e-2", *overrides]


def _trainer(tmp_path, *overrides, **kw) -> DPOTrainer:
    return DPOTrainer(load_config(DPOConfig, None, _cfg(tmp_path, *overrides, **kw)), verbose=False)


def test_the_loss_on_a_hand_computed_case():
    # ELBOs: B_theta(y_w) = -100, B_ref(y_w) = -102, B_theta(y_l) = -120, B_ref(y_l) = -119: logits 3
    pw = torch.tensor([-100.0], requires_grad=True)
    args = (pw, torch.tensor([-120.0]), torch.tensor([-102.0]), torch.tensor([-119.0]))
    paper = dpo_loss(*args, beta=0.2)  # z = 0.6
    assert paper.loss.item() == pytest.approx(math.log1p(math.exp(-0.6)), abs=1e-7)
    assert paper.loss.item() == pytest.approx(0.4374880, abs=1e-7)
    paper.loss.backward()
    assert pw.grad.item() == pytest.approx(-0.2 / (1 + math.exp(0.6)), abs=1e-7)  # -beta * sigma(-z)
    assert paper.metrics() == pytest.approx({"dpo_chosen_reward": 0.4, "dpo_rejected_reward": -0.2,
                                             "dpo_margin": 0.6, "dpo_accuracy": 1.0})
    dare = dpo_loss(*args, beta=0.2, elbo_divisor=512)  # DARE's code: every ELBO over the padded length 512
    assert dare.loss.item() == pytest.approx(0.6925614, abs=1e-7)


def test_policy_and_reference_score_the_same_masked_rows_and_pairs_draw_own_masks(tmp_path):
    trainer = _trainer(tmp_path)
    try:
        pairs, batch = trainer.next_micro_batch()
        assert batch.batch_size == 8 and len(pairs) == 4
        assert torch.equal(batch.completion_ids[:4], torch.nn.utils.rnn.pad_sequence(
            [torch.tensor(p.chosen.response_ids) for p in pairs], batch_first=True,
            padding_value=trainer.dlm.pad_token_id)[:, :batch.completion_len])
        seed = trainer.cfg.run.seed
        assert batch.sample_seeds.tolist() == [derive_seed(seed, n) % (1 << 62) for n in range(4)] + \
            [derive_seed(seed, n, REJECTED_STREAM) % (1 << 62) for n in range(4)]
        seen = {"policy": [], "reference": []}
        hooks = [m.register_forward_pre_hook(lambda _m, _a, kw, k=k: seen[k].append(kw["input_ids"].clone()),
                                             with_kwargs=True)
                 for k, m in (("policy", trainer.dlm.model), ("reference", trainer.reference.model))]
        loss, scored, metrics = trainer.micro_loss(batch)
        for h in hooks:
            h.remove()
        policy, reference = torch.cat(seen["policy"]), torch.cat(seen["reference"])
        assert policy.shape[0] == 8 * trainer.cfg.num_mc  # every response masks at least one token per row
        assert torch.equal(policy, reference)  # VRPO's antithetic sampling: identical masked inputs
        assert loss.item() == pytest.approx(math.log(2), abs=1e-7)  # policy = reference at the start
        assert metrics["dpo_margin"] == 0.0 and scored > 0
    finally:
        trainer.close()


def test_pairs_read_chat_messages_and_skip_or_refuse_bad_rows(tmp_path):
    rows = [{"prompt": "1+1=", "chosen": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}],
             "rejected": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "3"}]},
            {"prompt": "1+2=", "chosen": "3", "rejected": "3"}, {"prompt": "2+2=", "chosen": "4"}]
    trainer = _trainer(tmp_path, rows=rows)
    try:
        assert len(trainer.examples) == 1
        tok = trainer.tokenizer
        assert tok.decode(trainer.examples[0].chosen.response_ids[:-1]) == "2"
        assert tok.decode(trainer.examples[0].rejected.response_ids[:-1]) == "3"
        assert dict(trainer.report.dropped) == {"same_responses": 1, "missing_field": 1}
    finally:
        trainer.close()
    with pytest.raises(UserError, match=r"pairs.jsonl, line 2: chosen and rejected are the same .*on_bad_row=skip"):
        _trainer(tmp_path, "data.on_bad_row=error", rows=rows, name="strict")


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.dlm.state_dict().items()}


@pytest.mark.parametrize("family,lora", [("llada", False), ("sdar", True)])
def test_a_run_trains_checkpoints_and_resumes_exactly(tmp_path, family, lora):
    extra = [f"model.family={family}"] + (["lora.enabled=true", "lora.r=4"] if lora else [])
    straight = _trainer(tmp_path, *extra, name="a")
    start = _weights(straight)
    assert (straight.reference is None) == lora  # LoRA: the base weights are the reference, no copy
    straight.run()
    moved = _weights(straight)
    assert any(not torch.equal(start[k], moved[k]) for k in start)
    ma = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert ma[0]["loss"] == pytest.approx(math.log(2), abs=1e-7) and ma[0]["dpo_margin"] == 0.0
    assert all(math.isfinite(r["loss"]) for r in ma) and ma[1]["loss"] != ma[0]["loss"]
    first = _trainer(tmp_path, *extra, "train.stop_after=2", name="b")
    assert first.run().model_dir is None
    second = _trainer(tmp_path, *extra, "run.resume=latest", name="b")
    assert second.step == 2
    result = second.run()
    assert (result.model_dir / "config.json").is_file()
    b = _weights(second)
    assert all(torch.equal(moved[k], b[k]) for k in moved)
    mb = [json.loads(x)["loss"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert mb == [r["loss"] for r in ma]


@pytest.mark.parametrize("family", ["dream", "llada2", "llada_moe", "sdar_moe", "fast_dllm_v2"])
def test_every_other_text_family_trains_two_steps(tmp_path, family):
    # the families the runs above do not cover, from tiny checkpoints in their published layouts: DPO's first loss
    # is log 2 (policy = reference), then it moves
    from dllm_rl.models import build_model, char_tokenizer, save_model, tiny_config

    tok = char_tokenizer()
    cfg = tiny_config(family, vocab_size=len(tok), mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, hidden_size=16, intermediate_size=32, num_heads=2,
                      num_kv_heads=1, num_layers=1)
    save_model(build_model(family, cfg, seed=0), tmp_path / "ckpt", tokenizer=tok)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    trainer = DPOTrainer(load_config(DPOConfig, None, [
        f"model.path={tmp_path / 'ckpt'}", f"data.train_file={data}", "data.chat_template=never",
        "train.micro_batch_size=4", "train.max_steps=2", "run.progress=false", f"run.output_dir={tmp_path / 'run'}",
        "train.log_every=1", "optim.lr=1e-2", "num_mc=2"]), verbose=False)
    start = _weights(trainer)
    trainer.run()
    moved = _weights(trainer)
    assert any(not torch.equal(start[k], moved[k]) for k in start)
    losses = [json.loads(x)["loss"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-7) and math.isfinite(losses[1]) and losses[1] != losses[0]


def test_the_command_runs_and_lists_its_keys(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:  # --help-config prints the keys and exits, as --help does
        main(["dpo", "--help-config"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "beta" in out and "num_mc" in out and "data.chosen_field" in out
    assert main(["dpo", *_cfg(tmp_path, "train.max_steps=2", "num_mc=2", "beta=0.5")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-7)
    capsys.readouterr()
    assert main(["dpo", *_cfg(tmp_path, "beta=0", name="bad")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dllm-rl dpo: error:") and "beta" in err and len(err.strip().splitlines()) == 1
    # the reference scores the policy's image features, so they must not train: refused before any step
    assert main(["dpo", *_cfg(tmp_path, "model.train_vision=projector", name="vision")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dllm-rl dpo: error: model.train_vision=projector: dllm-rl dpo keeps")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "vision" / "metrics.jsonl").exists()


@pytest.mark.parametrize("family", ["llada_v", "mmada"])
def test_image_pairs_train_with_their_images(tmp_path, family):
    from image_fixture import write_image_checkpoints
    from PIL import Image

    from dllm_rl.models import char_tokenizer

    write_image_checkpoints(tmp_path, char_tokenizer())
    Image.new("RGB", (32, 32), (200, 30, 30)).save(tmp_path / "red.png")
    rows = [{"image": "red.png", "prompt": "colour\n", "chosen": "<answer>red</answer>",
             "rejected": "<answer>blue</answer>"}, {"image": "red.png", "prompt": "count\n", "chosen": "1",
                                                   "rejected": "2"}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(DPOConfig, None, [
        f"model.path={tmp_path / family}", f"data.train_file={tmp_path / 'pairs.jsonl'}", "data.chat_template=never",
        "train.micro_batch_size=2", "train.max_steps=2", "run.progress=false", f"run.output_dir={tmp_path / 'run'}",
        "train.log_every=1", "optim.lr=1e-2", "num_mc=2"])
    trainer = DPOTrainer(cfg, verbose=False)
    assert all(len(p.chosen.images) == 1 and len(p.rejected.images) == 1 for p in trainer.examples)
    result = trainer.run()
    losses = [json.loads(x)["loss"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-6) and math.isfinite(losses[1]) and losses[1] != losses[0]
    assert (result.model_dir / "config.json").is_file()
