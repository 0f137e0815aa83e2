"""The SFT trainer: loss goes down, exact resume, LoRA runs, the CLI entry."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from dllm_rl.config import load_config
from dllm_rl.models import load_model
from dllm_rl.sft.cli import register
from dllm_rl.sft.config import SFTConfig
from dllm_rl.sft.data import collate
from dllm_rl.sft.objectives import compute_objective
from dllm_rl.sft.trainer import SFTTrainer, train

ROWS = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a in range(4) for b in range(3)]


def _cfg(tmp_path, *overrides, rows=ROWS, name="run"):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = [
        "model.tokenizer=char", "model.alphabet=0123456789+=", "model.hidden_size=32", "model.num_layers=2",
        "model.num_heads=2", "model.num_kv_heads=2", "model.intermediate_size=64", f"data.train_file={data}",
        "data.max_length=16", "train.micro_batch_size=4", "train.max_steps=4", "run.progress=false",
        f"run.output_dir={tmp_path / name}", "train.log_every=1", "optim.lr=3e-3", "optim.warmup_steps=1",
    ]
    return load_config(SFTConfig, None, base + list(overrides))


def _fixed_loss(trainer, draws=8):
    """The objective on the first 8 examples, averaged over ``draws`` fixed mask draws (same before / after)."""
    batch = collate(trainer.examples[:8], trainer.dlm.pad_token_id)
    name, opts = trainer.cfg.objective.name, trainer.cfg.objective.options()
    total = 0.0
    with torch.no_grad():
        for seed in range(draws):
            gen = torch.Generator().manual_seed(seed)
            out = compute_objective(name, trainer.dlm, batch, gen, **opts)
            total += out.loss.item()
    return total / draws


@pytest.mark.parametrize("family,objective", [("llada", "random_mask"), ("sdar", "block")])
def test_training_reduces_loss_on_a_fixed_batch(tmp_path, family, objective):
    # one fixed batch of 8 examples, seen at every step
    cfg = _cfg(tmp_path, f"model.family={family}", f"objective.name={objective}", "train.max_steps=30",
               "optim.lr=1e-2", "train.micro_batch_size=8", "data.pad_response_to=4", rows=ROWS[:8])
    trainer = SFTTrainer(cfg, verbose=False)
    before = _fixed_loss(trainer)
    result = trainer.run()
    after = _fixed_loss(trainer)
    assert after < 0.5 * before, (before, after)
    assert result.step == 30 and (result.model_dir / "config.json").is_file()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and {"loss", "lr", "tokens_per_s", "grad_norm", "epoch"} <= set(rows[0])
    reloaded = load_model(result.model_dir)
    assert reloaded.family.name == family


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.dlm.state_dict().items()}


@pytest.mark.parametrize("lora", [False, True])
def test_resume_is_exact(tmp_path, lora):
    extra = ["lora.enabled=true", "lora.r=4"] if lora else []
    straight = SFTTrainer(_cfg(tmp_path, *extra, name="a"), verbose=False)
    straight.run()
    first = SFTTrainer(_cfg(tmp_path, *extra, "train.stop_after=2", name="b"), verbose=False)
    r1 = first.run()
    assert r1.step == 2 and r1.model_dir is None  # stopped early: checkpoint only
    second = SFTTrainer(_cfg(tmp_path, *extra, "run.resume=auto", name="b"), verbose=False)
    assert second.step == 2
    second.run()
    a, b = _weights(straight), _weights(second)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ma = [json.loads(x)["loss"] for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x)["loss"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert ma == mb and len(ma) == 4


def test_existing_checkpoints_need_resume(tmp_path):
    train(_cfg(tmp_path, "train.max_steps=1"), verbose=False)
    with pytest.raises(ValueError, match="run.resume=latest"):
        SFTTrainer(_cfg(tmp_path, "train.max_steps=1"), verbose=False)


def test_grad_accum_and_epochs(tmp_path):
    cfg = _cfg(tmp_path, "train.num_epochs=2", "train.grad_accum=2", "train.micro_batch_size=3")
    trainer = SFTTrainer(cfg, verbose=False)
    assert trainer.max_steps == 4  # ceil(2 * 12 / (3 * 2))
    trainer.run()
    assert trainer.stream.consumed == 24


def test_cli_register_and_overrides(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit) as stop:  # --help-config prints the keys and exits, as --help does
        parser.parse_args(["sft", "--help-config"])
    assert stop.value.code == 0
    assert "objective.name" in capsys.readouterr().out
    cfg = _cfg(tmp_path)
    yaml_path = tmp_path / "c.yaml"
    from dllm_rl.config import save_config

    save_config(cfg, yaml_path)
    args = parser.parse_args(["sft", str(yaml_path), "train.max_steps=2"])
    assert args.func(args) == 0
    assert (tmp_path / "run" / "checkpoints" / "step-0000002").is_dir()
    with pytest.raises(ValueError, match="objective"):
        parser.parse_args(["sft", str(yaml_path), "objective.nam=block"]).func(
            parser.parse_args(["sft", str(yaml_path), "objective.nam=block"]))


def test_gradient_checkpointing_gives_the_same_weights(tmp_path):
    plain = SFTTrainer(_cfg(tmp_path, "train.max_steps=2", name="plain"), verbose=False)
    plain.run()
    ckpt = SFTTrainer(_cfg(tmp_path, "train.max_steps=2", "model.gradient_checkpointing=true", name="gc"),
                      verbose=False)
    assert ckpt.dlm.model.is_gradient_checkpointing
    ckpt.run()
    for (k, a), b in zip(_weights(plain).items(), _weights(ckpt).values()):
        assert torch.allclose(a, b, atol=1e-6), k


def test_init_std_redraws_weight_matrices(tmp_path):
    trainer = SFTTrainer(_cfg(tmp_path, "model.init_std=0.1", "train.max_steps=1"), verbose=False)
    emb = trainer.dlm.model.model.embed_tokens.weight
    assert abs(emb.std().item() - 0.1) < 0.01
    assert torch.equal(trainer.dlm.model.model.norm.weight, torch.ones_like(trainer.dlm.model.model.norm.weight))
    again = SFTTrainer(_cfg(tmp_path, "model.init_std=0.1", "train.max_steps=1", name="again"), verbose=False)
    assert torch.equal(again.dlm.model.model.embed_tokens.weight, emb)  # seeded by run.seed


def test_exploded_or_nan_weights_stop_the_run_naming_the_step_and_write_no_model(tmp_path):
    """optim.lr=1e30 (finite, so the config takes it) throws every weight to about 1e30 in one update, still finite:
    a run that ended before they overflowed saved them with rc 0 and no warning. The weight check stops it at that
    step (step 2: step 1's warmup learning rate is 0), before its checkpoint, naming the norms and the learning
    rate; NaN weights (an infinite learning rate) stop it the same way. model/ is never written."""
    from dllm_rl.training.finite import TrainingStopped

    for lr, step, words in (
        (1e30, 2, r"the model's weights' norm grew from [\d.]+ to [\d.]+e\+3\d \(x[\d.]+e\+\d\d\) in one update at "
                  r"optim.lr=1e\+30 \(the guard stops a change beyond x2 or x0\.5\)"),
        (math.inf, 1, r"the update left NaN/inf weights in the model \(optim.lr=inf\)"),  # warmup: 0 x inf = NaN
    ):
        cfg = _cfg(tmp_path, "optim.max_grad_norm=null", "train.max_steps=8", "run.save_every=1",
                   "run.keep_checkpoints=0", "run.overwrite=true")
        cfg.optim.lr = lr  # inf: past the config's check, which refuses it
        with pytest.raises(TrainingStopped, match=rf"^sft: stopping at step {step}: {words}; model/ is not written\. "
                           r"Lower the learning rate \(optim.lr\) and start again, or resume from an earlier "
                           r"checkpoint$"):
            train(cfg, verbose=False)
        run = tmp_path / "run"
        assert not (run / "model").exists()
        metrics = run / "metrics.jsonl"
        assert [json.loads(x)["step"] for x in (metrics.read_text() if metrics.exists() else "").splitlines()] == \
            list(range(1, step))
        assert sorted(p.name for p in run.glob("checkpoints/*")) == [f"step-{s:07d}" for s in range(1, step)]
