"""Certainty-forcing self-distillation (dParallel, arXiv 2509.26488; dllm_rl.sft.certainty): the loss against a hand
computation, the semi-autoregressive masks, and the two-command recipe (the model's own right answers from
`dllm-rl eval`, then `dllm-rl sft objective.name=certainty_forcing`) on the block demo model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dllm_rl.cli import main
from dllm_rl.eval.demo import DEMO_DIR
from dllm_rl.models import build_model, char_tokenizer, tiny_config
from dllm_rl.sft.certainty import certainty_terms, semi_ar_rows
from dllm_rl.sft.data import DataConfig, collate, encode_row, load_sft_data

REPO = Path(__file__).resolve().parents[2]


def _entropy(row: list[float], t: float) -> float:
    z = [x / t for x in row]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    p = [x / sum(e) for x in e]
    return -sum(q * math.log(q) for q in p)


def _nll(row: list[float], target: int) -> float:
    return -(row[target] - math.log(sum(math.exp(x) for x in row)))


def test_loss_by_hand():
    """Three masked positions over a vocabulary of 3: two predicted right (argmax = target), one wrong. The CE averages
    all three; the entropy (at T = 0.5) only the two right ones; beta = 2."""
    rows = [[2.0, 0.0, -1.0], [0.0, 1.0, 0.5], [0.3, 0.1, 1.2]]
    targets = [0, 2, 2]  # right, wrong (argmax 1), right
    terms = certainty_terms(torch.tensor(rows, requires_grad=True), torch.tensor(targets), temperature=0.5,
                            weight=2.0)
    ce = sum(_nll(r, t) for r, t in zip(rows, targets)) / 3
    cert = (_entropy(rows[0], 0.5) + _entropy(rows[2], 0.5)) / 2
    assert terms.masked == 3 and terms.correct == 2
    assert terms.ce.item() == pytest.approx(ce, rel=1e-6)
    assert terms.certainty.item() == pytest.approx(cert, rel=1e-6)
    assert terms.loss.item() == pytest.approx(ce + 2.0 * cert, rel=1e-6)
    # the wrong prediction is never pushed to be sure: its logits get the CE's gradient only
    logits = torch.tensor(rows, requires_grad=True)
    certainty_terms(logits, torch.tensor(targets), temperature=0.5, weight=2.0).loss.backward()
    ce_only = torch.tensor(rows, requires_grad=True)
    certainty_terms(ce_only, torch.tensor(targets), temperature=0.5, weight=0.0).loss.backward()
    assert torch.allclose(logits.grad[1], ce_only.grad[1]) and not torch.allclose(logits.grad[0], ce_only.grad[0])
    # no prediction right: the certainty term is 0; no masked position: a zero loss that backward accepts
    none_right = certainty_terms(torch.tensor([rows[1]]), torch.tensor([2]), temperature=0.5, weight=2.0)
    assert none_right.certainty.item() == 0.0 and none_right.loss.item() == pytest.approx(_nll(rows[1], 2))
    empty = certainty_terms(torch.zeros(0, 3, requires_grad=True), torch.zeros(0, dtype=torch.long),
                            temperature=0.5, weight=2.0)
    assert empty.loss.item() == 0.0 and empty.loss.requires_grad


def _batch(tok, answers: list[str], pad_to: int):
    rows = [{"prompt": f"p{i}\n", "response": a} for i, a in enumerate(answers)]
    cfg = DataConfig(train_file="x", chat_template="never", pad_response_to=pad_to)
    examples = [encode_row(r, cfg, tok, tok.eos_token_id, False) for r in rows]
    batch = collate(examples, tok.pad_token_id, None)
    batch.sample_seeds = torch.arange(len(rows))
    return batch


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_semi_autoregressive_masks(family):
    """One block of each answer is drawn: earlier blocks clean, its tokens masked (the complement row masks exactly
    the others), every later block masked whole; only the drawn block is scored."""
    tok = char_tokenizer()
    cfg = tiny_config(family, vocab_size=len(tok), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=16, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = build_model(family, cfg, seed=0)
    batch = _batch(tok, ["abcdefg", "hijklmnopq", "rs"], pad_to=12)
    ids, scored, sample = semi_ar_rows(model, batch, torch.Generator().manual_seed(3), block_size=4, mask_ratio=0.5,
                                       complement=True)
    b, p = batch.batch_size, batch.prompt_len
    assert sample.tolist() == [0, 1, 2, 0, 1, 2] and ids.shape == (2 * b, p + 12)
    from dllm_rl.sft.certainty import answer_blocks

    blk = answer_blocks(model, batch, 4)
    mask_id = tok.mask_token_id
    for i in range(b):
        first, second = scored[i], scored[b + i]
        assert not (first & second).any()
        drawn = first | second
        active = set(blk[i][drawn].tolist())
        assert len(active) == 1  # one block
        n = active.pop()
        assert drawn.tolist() == ((blk[i] == n) & batch.completion_mask[i]).tolist()  # the whole block, once
        for row, m in ((ids[i], first), (ids[b + i], second)):
            comp = row[p:]
            assert (comp[m] == mask_id).all()
            assert torch.equal(comp[blk[i] < n], batch.completion_ids[i][blk[i] < n])  # context clean
            assert (comp[blk[i] > n] == mask_id).all()  # future masked
            assert torch.equal(row[:p], batch.prompt_ids[i])
    if family == "sdar":  # the model's own blocks of 4, counted from the prompt's start as the sampler counts them
        from dllm_rl.models.masks import block_index, position_ids_from_valid

        assert torch.equal(blk, block_index(position_ids_from_valid(batch.valid()), 4)[:, p:])


@pytest.mark.slow  # two commands on the demo model (about 6 s)
def test_two_commands_on_the_block_demo(tmp_path):
    """`dllm-rl eval` on training puzzles writes the demo model's own answers, each marked correct; `dllm-rl sft
    objective.name=certainty_forcing data.keep_if=correct` trains 2 steps on the right ones only and logs the loss's
    parts."""
    data = tmp_path / "data"
    assert main(["eval", str(DEMO_DIR / "sdar-countdown"), "--demo", "--data", str(DEMO_DIR / "countdown_train.jsonl"),
                 "--limit", "24", "-o", str(data), "--no-progress"]) == 0
    items = [json.loads(x) for x in (data / "items" / "default.jsonl").read_text().splitlines()]
    right = sum(r["correct"] for r in items)
    assert 0 < right < len(items)
    out = tmp_path / "cf"
    assert main(["sft", str(REPO / "configs" / "demo-sft-certainty-forcing.yaml"),
                 f"model.path={DEMO_DIR / 'sdar-countdown'}",
                 f"data.train_file={data / 'items/default.jsonl'}",
                 f"run.output_dir={out}", "train.max_steps=2", "train.micro_batch_size=4", "train.log_every=1",
                 "run.progress=false"]) == 0
    report = json.loads((out / "data_report.json").read_text())
    assert report["kept"] == right and report["dropped"] == {"not_kept": len(items) - right}
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["loss"]) and r["ce"] > 0 and r["certainty"] >= 0 and 0 <= r["correct_frac"] <= 1
        # loss = ce + beta * certainty, both halves (the row and its complement) summed
        assert r["loss"] == pytest.approx(r["ce"] + 2.0 * r["certainty"], rel=1e-4)
    assert (out / "model" / "model.safetensors").is_file()


def test_keep_if_counts_the_rest_as_dropped_never_an_error(tmp_path):
    tok = char_tokenizer()
    f = tmp_path / "items.jsonl"
    f.write_text("".join(json.dumps({"prompt": "q\n", "completion": a, "correct": ok}) + "\n"
                         for a, ok in (("a", True), ("b", False), ("c", True), ("d", None))))
    cfg = DataConfig(train_file=str(f), prompt_field="prompt", response_field="completion", keep_if="correct",
                     chat_template="never", on_bad_row="error")
    examples, report = load_sft_data(cfg, tok, tok.eos_token_id, verbose=False)
    assert len(examples) == 2 and report.read == 4 and dict(report.dropped) == {"not_kept": 2}
