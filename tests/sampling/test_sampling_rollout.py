"""Rollout container: len, select, cat (padding), to, texts."""

import torch

from dllm_rl.models import DiffusionLM, char_tokenizer, get_family
from dllm_rl.sampling import DecodeConfig, Rollout, generate


def _rollout(prompt_rows, completion_rows, pad=0):
    p_w = max(len(p) for p in prompt_rows)
    g_w = max(len(c) for c in completion_rows)
    prompt = torch.tensor([[pad] * (p_w - len(p)) + p for p in prompt_rows])
    comp = torch.tensor([c + [pad] * (g_w - len(c)) for c in completion_rows])
    steps = torch.tensor([list(range(len(c))) + [-1] * (g_w - len(c)) for c in completion_rows])
    return Rollout(
        prompt_ids=prompt, prompt_mask=prompt != pad, completion_ids=comp, completion_mask=steps >= 0,
        step_map=steps, nfe=torch.tensor([len(c) for c in completion_rows]),
        finish_reason=["length"] * len(prompt_rows), texts=[str(c) for c in completion_rows],
        confidence=(steps >= 0).float() / 2, pad_token_id=pad,
    )


def test_select_and_cat_pad_prompts_left_and_completions_right():
    a = _rollout([[5, 6], [7]], [[1, 2, 3], [4]])
    b = _rollout([[8, 9, 10]], [[2, 2, 2, 2, 2]])
    both = Rollout.cat([a, b])
    assert len(both) == 3
    assert both.prompt_ids.tolist() == [[0, 5, 6], [0, 0, 7], [8, 9, 10]]
    assert both.prompt_mask.tolist() == [[False, True, True], [False, False, True], [True, True, True]]
    assert both.completion_ids.tolist() == [[1, 2, 3, 0, 0], [4, 0, 0, 0, 0], [2, 2, 2, 2, 2]]
    assert both.step_map.tolist() == [[0, 1, 2, -1, -1], [0, -1, -1, -1, -1], [0, 1, 2, 3, 4]]
    assert both.completion_mask.sum(-1).tolist() == [3, 1, 5]
    assert both.confidence.tolist()[1] == [0.5, 0.0, 0.0, 0.0, 0.0]
    assert both.nfe.tolist() == [3, 1, 5] and both.texts == ["[1, 2, 3]", "[4]", "[2, 2, 2, 2, 2]"]
    sel = both.select([2, 0])
    assert sel.completion_ids.tolist() == [[2, 2, 2, 2, 2], [1, 2, 3, 0, 0]]
    assert sel.finish_reason == ["length", "length"] and sel.texts == ["[2, 2, 2, 2, 2]", "[1, 2, 3]"]
    assert both.select(1).nfe.tolist() == [1]
    assert both.select(torch.tensor([True, False, True])).nfe.tolist() == [3, 5]
    assert both.select(slice(1, None)).nfe.tolist() == [1, 5]
    moved = both.to("cpu")
    assert moved.prompt_ids.device.type == "cpu" and torch.equal(moved.step_map, both.step_map)


def test_texts_stop_at_first_eos_and_skip_specials(fakes):
    tok = char_tokenizer("abc")  # ids: 0 <pad>, 1 <eos>, 2 <mask>, 3 <unk>, 4 a, 5 b, 6 c
    rows = {1: (4, 0.9), 2: (5, 0.9), 3: (1, 0.9), 4: (6, 0.9)}  # "a b <eos> c"
    table = fakes.table_from(rows, vocab=7)
    model = DiffusionLM(fakes.FakeHF(table), get_family("llada"),
                        {"mask_token_id": 2, "eos_token_id": 1, "pad_token_id": 0})
    r = generate(model, [[4]], DecodeConfig(gen_length=4, block_length=4), tokenizer=tok)
    assert r.completion_ids[0].tolist() == [4, 5, 1, 6]
    assert r.texts == ["ab"] and r.finish_reason == ["eos"]
    assert r.completion_mask[0].tolist() == [True, True, True, False]
