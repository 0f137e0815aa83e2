"""Rollout hooks: the sampler's pre-filled tokens, replacing samples, and IGPO's inpainting of all-fail groups."""

from __future__ import annotations

import random

import pytest
import torch

from dllm_rl.jsonl import write_jsonl
from dllm_rl.models import build_model, char_tokenizer, tiny_config
from dllm_rl.rl.hooks import HookContext, RoundView, make_hook, replace_samples
from dllm_rl.rl.methods.igpo import inpaint_positions
from dllm_rl.sampling import DecodeConfig, generate
from dllm_rl.tasks import get_task


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_prefilled_tokens_are_kept_and_never_decoded(tok, family):
    cfg = tiny_config(family, vocab_size=len(tok), mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, hidden_size=16, intermediate_size=32, num_heads=2,
                      num_kv_heads=1, num_layers=1)
    model = build_model(family, cfg, seed=0)
    prompts = [tok.encode("nums 1 2", add_special_tokens=False)] * 2
    seven, plus = tok.convert_tokens_to_ids(["7", "+"])
    prefill = [{0: seven, 2: plus}, {}]
    decode = DecodeConfig(gen_length=8, block_length=4, stop_on_eos=False)
    out = generate(model, prompts, decode, seeds=[1, 1], prefill=prefill)
    free = generate(model, prompts[1:], decode, seeds=[1])
    assert out.completion_ids[0, 0].item() == seven and out.completion_ids[0, 2].item() == plus
    assert out.step_map[0, 0].item() == -1 and out.step_map[0, 2].item() == -1
    assert (out.step_map[0, [1, 3, 4, 5, 6, 7]] >= 0).all()
    assert torch.equal(out.completion_ids[1], free.completion_ids[0])  # an empty prefill changes nothing
    with pytest.raises(ValueError, match=r"prefill\[0\]: offset 8 is outside the 8 completion slots"):
        generate(model, prompts[:1], decode, prefill=[{8: seven}])


def _view(tok, rewards):
    from dllm_rl.sampling import Rollout

    n = len(rewards)
    comp = torch.full((n, 3), tok.eos_token_id)
    comp[:, 0] = torch.arange(n) + 10
    roll = Rollout(prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.bool),
                   completion_ids=comp, completion_mask=torch.ones(n, 3, dtype=torch.bool),
                   step_map=torch.zeros(n, 3, dtype=torch.long), nfe=torch.ones(n, dtype=torch.long),
                   finish_reason=["eos"] * n, texts=[f"t{i}" for i in range(n)])
    return RoundView([[1, 1]] * n, ["p"] * n, roll, list(rewards), ["r"] * n, list(range(n)),
                     {"solution": ["1+2", "1+2", "3*3", "3*3"][:n]}, 2)


def test_replace_samples_swaps_rows_and_rewards(tok):
    view = _view(tok, [0.0, 0.0, 1.0, 0.0])
    new = view.rollout.select([2, 3])
    out = replace_samples(view, [0, 3], new, [1.0, 0.5], ["a", "b"])
    assert out.rollout.completion_ids[:, 0].tolist() == [12, 11, 12, 13]
    assert out.rewards == [1.0, 0.0, 1.0, 0.5] and out.reasons == ["a", "r", "r", "b"]
    assert view.rewards == [0.0, 0.0, 1.0, 0.0]  # the input view is left as it was


def test_inpaint_positions_cover_the_ratio_in_whole_chunks():
    pos = inpaint_positions(20, 0.3, 2, 3, random.Random(0))
    assert len(pos) >= 6 and len(pos) <= 6 + 3 - 1
    assert pos == sorted(set(pos)) and all(0 <= p < 20 for p in pos)
    assert inpaint_positions(5, 0.0, 2, 3, random.Random(0)) == []
    assert inpaint_positions(5, 1.0, 2, 3, random.Random(0)) == [0, 1, 2, 3, 4]


def test_igpo_inpaints_only_all_fail_groups_and_replaces_up_to_the_limit(tok):
    view = _view(tok, [0.0, 0.0, 1.0, 0.0])  # group 0 (samples 0, 1) all fail; group 1 has a success
    calls = []

    def generate(indices, prefill):
        calls.append((indices, prefill))
        return view.rollout.select([2, 3])  # stand-in decodes

    ctx = HookContext(generate=generate, reward=lambda idx, roll: ([1.0, 1.0], ["ok", "ok"]),
                      reference=lambda i: None, tokenizer=tok, eos_token_id=tok.eos_token_id, gen_length=6, step=0)
    hook = make_hook("igpo", {"column": "solution", "max_replacements": 1, "ratio_low": 1.0, "ratio_high": 1.0,
                              "min_chunk": 1, "max_chunk": 2})
    out = hook(view, ctx)
    assert len(calls) == 1 and calls[0][0] == [0, 1]
    ref = tok.encode("1+2", add_special_tokens=False) + [tok.eos_token_id]
    assert calls[0][1] == [dict(enumerate(ref))] * 2  # ratio 1: the whole reference, EOS included
    assert out.rewards == [1.0, 0.0, 1.0, 0.0]  # one replacement (max_replacements=1), group 1 untouched
    assert out.rollout.completion_ids[:, 0].tolist() == [12, 11, 12, 13]
    assert out.stats == {"igpo_groups": 1.0, "igpo_replaced": 1.0}
    valid = r"d_treerpo, egspo_returns, igpo, mdpo, off \(no hook\)"
    with pytest.raises(ValueError, match=f"rollout_hook: unknown hook 'nope'; valid: {valid}$"):
        make_hook("nope", {})


def test_igpo_inpaints_the_tasks_reference_completion_by_default(tok, tmp_path):
    """Countdown's data column ``solution`` is the bare expression; the hook inpaints the task's reference
    completion, whose tokens decode to a completion the task scores 1.0 (the bare expression scores 0)."""
    write_jsonl(tmp_path / "cd.jsonl", [{"nums": [1, 2, 3], "target": 9, "solution": "(1+2)*3"}])
    task = get_task("countdown", data=str(tmp_path / "cd.jsonl"), prompt_style="compact")
    ex = task.examples[0]
    view = _view(tok, [0.0, 0.0])
    view.columns["solution"] = [ex["solution"]] * 2
    calls = []

    def generate(indices, prefill):
        calls.append(prefill)
        return view.rollout.select([0, 1])

    ctx = HookContext(generate=generate, reward=lambda idx, roll: ([0.0, 0.0], ["no", "no"]),
                      reference=lambda i: task.reference_completion(ex), tokenizer=tok,
                      eos_token_id=tok.eos_token_id, gen_length=32, step=0)
    make_hook("igpo", {"ratio_low": 1.0, "ratio_high": 1.0})(view, ctx)
    ids = [calls[0][0][k] for k in sorted(calls[0][0])]
    assert ids[-1] == tok.eos_token_id
    text = tok.decode(ids[:-1])
    assert text == "<answer>(1+2)*3</answer>"
    assert task.score_one(text, ex) == 1.0 and task.score_one(ex["solution"], ex) == 0.0
