"""SFT of a uniform-state family (DiffusionGemma): the published denoising cross-entropy with two-pass
self-conditioning on a hand case, a short CLI run on a tiny checkpoint, and the refusal of an objective of the other
noise kind."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dllm_rl.cli import main
from dllm_rl.config import ConfigError
from dllm_rl.estimators import ScoringBatch
from dllm_rl.estimators.uniform_denoise import denoise_scores
from dllm_rl.models import build_model, load_model, tiny_config
from dllm_rl.models.families import FAMILIES
from dllm_rl.models.loading import save_model
from dllm_rl.sft.objectives import check_objective, compute_objective, sequence_loss

V = 4
BASE = torch.tensor([[2.0, 0.0, 0.0, -1.0], [0.0, 1.0, 0.5, 0.0]])  # position l's logits, whatever the canvas
BOOST = torch.tensor([[0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])  # added when self-conditioning is on


class Scripted:
    """One canvas of two positions; logits ``BASE`` without self-conditioning, ``BASE + BOOST`` with it (per row, as
    ``self_conditioning_mask`` says). Records what each call got."""

    width, vocab, num, embedding_dtype = 2, V, 1, torch.float32

    def __init__(self, batch):
        self.batch, self.calls = batch, []

    def __iter__(self):
        yield 0, self.batch.completion_ids, self.batch.completion_mask

    def hidden(self, noisy, self_conditioning=None, self_conditioning_mask=None):
        self.calls.append((noisy.clone(), self_conditioning, self_conditioning_mask, torch.is_grad_enabled()))
        out = BASE.expand(noisy.shape[0], -1, -1).clone().requires_grad_()
        if self_conditioning is not None:
            out = out + self_conditioning_mask.float()[:, None, None] * BOOST
        return out

    def head(self, hidden):
        return hidden.float()


def _batch(n: int) -> ScoringBatch:
    comp = torch.tensor([[1, 3]] * n)
    counted = torch.ones_like(comp, dtype=torch.bool)
    counted[0, 1] = False  # the first row counts one token
    return ScoringBatch(torch.full((n, 1), 2), torch.ones(n, 1, dtype=torch.bool), comp, counted)


def _ce(logits: torch.Tensor, target: int) -> float:
    return -(logits[target] - torch.logsumexp(logits, 0)).item()


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_the_loss_is_the_flat_cross_entropy_of_the_scored_pass(p):
    batch = _batch(3)
    canvases = Scripted(batch)
    scores = denoise_scores(canvases, batch, torch.Generator().manual_seed(0), num_mc=1, eps=1e-3,
                            self_conditioning_p=p, chunk_size=0)
    logits = BASE + BOOST if p else BASE
    a, b = _ce(logits[0], 1), _ce(logits[1], 3)
    # the sum over the answer divided by its length, averaged over the batch (the first row counts one token)
    want = (a + (a + b) / 2 + (a + b) / 2) / 3
    assert sequence_loss(scores, batch.lengths).item() == pytest.approx(want, rel=1e-6)
    if p:  # two passes: the first without gradient and without self-conditioning, the second fed its logits
        (first, sc1, _, grad1), (second, sc2, mask2, grad2) = canvases.calls
        assert sc1 is None and not grad1 and grad2 and torch.equal(first, second)
        assert torch.equal(sc2, BASE.expand(3, -1, -1)) and mask2.all()
    else:
        assert len(canvases.calls) == 1 and canvases.calls[0][1] is None


def test_corruption_rate_and_uncounted_positions_stay_clean():
    batch = _batch(3000)
    canvases = Scripted(batch)
    scores = denoise_scores(canvases, batch, torch.Generator().manual_seed(1), num_mc=1, eps=1e-3,
                            self_conditioning_p=0.5, chunk_size=0)
    noisy = canvases.calls[-1][0]
    assert noisy[0, 1] == 3  # uncounted: clean
    changed = (noisy != batch.completion_ids)[1:].float().mean().item()
    # a position takes a uniform id with probability t ~ U(eps, 1): E[changed] = E[t] (1 - 1/V)
    assert changed == pytest.approx(0.5 * (1 + 1e-3) * (1 - 1 / V), abs=0.015)
    flags = scores.info["self_conditioned"].float().mean().item()
    assert flags == pytest.approx(0.5, abs=0.03)


def test_objectives_refuse_the_other_noise_kind():
    with pytest.raises(ConfigError) as err:
        check_objective("random_mask", FAMILIES["diffusion_gemma"])
    assert str(err.value) == ("objective.name=random_mask trains masked diffusion; diffusion_gemma is uniform-state: "
                              "use objective.name=uniform")
    with pytest.raises(ConfigError) as err:
        check_objective("uniform", FAMILIES["llada"])
    assert str(err.value) == ("objective.name=uniform trains uniform-state diffusion; llada is masked: use "
                              "objective.name=random_mask, block, trace, ar, certainty_forcing")


ROWS = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a in range(3) for b in range(2)]


def _checkpoint(tmp_path):
    cfg = tiny_config("diffusion_gemma", vocab_size=32, hidden_size=32, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=4)
    path = tmp_path / "dgemma"
    save_model(build_model("diffusion_gemma", cfg, seed=0), path)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path, data


def _fixed_loss(dlm, batch) -> float:
    with torch.no_grad():
        return sum(compute_objective("uniform", dlm, batch, torch.Generator().manual_seed(s)).loss.item()
                   for s in range(4)) / 4


def test_cli_sft_on_a_tiny_diffusion_gemma_lowers_the_loss_and_saves_the_published_layout(tmp_path, capsys):
    path, data = _checkpoint(tmp_path)
    out = tmp_path / "run"
    common = [f"model.path={path}", "model.tokenizer=char", "model.alphabet=0123456789+=", f"data.train_file={data}",
              "data.max_length=16", "train.micro_batch_size=6", "run.progress=false", f"run.output_dir={out}",
              "optim.lr=1e-2", "optim.warmup_steps=0", "train.log_every=1"]
    assert main(["sft", *common, "objective.name=uniform", "train.max_steps=3"]) == 0
    trained = load_model(out / "model")
    assert trained.family.name == "diffusion_gemma" and trained.mask_token_id is None
    published = json.loads((out / "model" / "config.json").read_text())
    assert published["architectures"] == ["DiffusionGemmaForBlockDiffusion"] and published["canvas_length"] == 4
    from dllm_rl.sft.config import DataConfig, ModelConfig
    from dllm_rl.sft.data import collate, load_sft_data
    from dllm_rl.sft.model_build import build_tokenizer_and_model
    tok, start = build_tokenizer_and_model(ModelConfig(path=str(path), tokenizer="char", alphabet="0123456789+="))
    examples, _ = load_sft_data(DataConfig(train_file=str(data), max_length=16), tok, start.eos_token_id,
                                verbose=False)
    batch = collate(examples, start.pad_token_id)
    before, after = _fixed_loss(start, batch), _fixed_loss(trained, batch)
    assert after < 0.9 * before, (before, after)
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    # the other noise kind: one line, status 2
    capsys.readouterr()
    assert main(["sft", *common, f"run.output_dir={tmp_path / 'bad'}", "objective.name=random_mask"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "objective.name=random_mask trains masked diffusion; diffusion_gemma is uniform-state: use "
        "objective.name=uniform")
