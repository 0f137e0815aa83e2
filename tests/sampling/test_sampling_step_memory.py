"""A step's float64 work runs a few rows at a time (bounded memory at real vocabularies) and changes no token:
each row keeps its own generator and draws in the same order."""

import pytest
import torch

from dllm_rl.sampling import DecodeConfig, generate
from dllm_rl.sampling import confidence as conf_mod
from dllm_rl.sampling.confidence import choose_tokens


def _spy_rows(monkeypatch) -> list[int]:
    seen: list[int] = []
    real = conf_mod.sample_tokens

    def spy(logits, *args, **kwargs):
        assert logits.dtype == torch.float64
        seen.append(int(logits.shape[0]))
        return real(logits, *args, **kwargs)

    monkeypatch.setattr(conf_mod, "sample_tokens", spy)
    return seen


@pytest.mark.parametrize("rule", ["prob", "margin", "entropy", "random"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_row_chunks_give_the_same_tokens_and_confidences(monkeypatch, rule, temperature):
    logits = torch.randn(5, 4, 64, generator=torch.Generator().manual_seed(0)) * 3
    needs = temperature > 0 or rule == "random"

    def run(max_elements):
        gens = [torch.Generator().manual_seed(10 + i) for i in range(5)] if needs else None
        return choose_tokens(logits, temperature, 10, 0.9, rule, gens, max_elements)

    whole = run(None)  # 5 x 4 x 64 elements: one chunk under the default budget
    seen = _spy_rows(monkeypatch)
    for budget, rows in ((1, [1, 1, 1, 1, 1]), (2 * 4 * 64, [2, 2, 1])):
        seen.clear()
        tokens, conf, ent = run(budget)
        assert seen == rows
        assert torch.equal(tokens, whole[0]) and torch.equal(conf, whole[1]) and torch.equal(ent, whole[2])
    assert whole[0].shape == (5, 4) and conf.dtype == torch.float64
    assert len(set(whole[0].flatten().tolist())) > 3  # not a constant answer


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_generate_is_unchanged_when_each_step_runs_one_row_at_a_time(tiny_models, monkeypatch, family):
    model = tiny_models[family]
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    cfg = DecodeConfig(gen_length=8, block_length=4, steps=2, temperature=1.0, top_p=0.95, confidence="prob")
    want = generate(model, prompts, cfg, seeds=[3, 4, 5])
    seen = _spy_rows(monkeypatch)
    monkeypatch.setattr(conf_mod, "STEP_ELEMENTS", 1)
    got = generate(model, prompts, cfg, seeds=[3, 4, 5])
    assert seen and set(seen) == {1}
    assert torch.equal(got.completion_ids, want.completion_ids)
    assert torch.equal(got.step_map, want.step_map)
    assert torch.equal(got.confidence, want.confidence)
    assert torch.equal(got.entropy, want.entropy)
