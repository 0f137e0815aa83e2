"""What an engine step copies (``Engine.copies``): a step's keys and values written once, its rows' new columns
only, whatever the slots and the positions already cached; under load newcomers take the holes finished rows left,
so no running row's cache moves."""

import pytest
import torch

from dllm_rl.sampling import DecodeConfig, generate
from dllm_rl.sampling.engine import Engine, EngineConfig

PER_COLUMN = 2 * 2 * 1 * 16 * 4  # tiny SDAR: layers x (keys, values) x KV heads x head dim x float32 bytes


def _steps(engine):
    """Each step's copies while ``engine`` runs (wraps its ``step``)."""
    seen, real = [], engine.step

    def step():
        out = real()
        seen.append(dict(engine.copies.step))
        return out

    engine.step = step
    return seen


@pytest.mark.parametrize("slots", [2, 8])
def test_a_step_copies_its_rows_new_columns_whatever_the_slots_and_positions(tiny_models, slots):
    model = tiny_models["sdar"]
    config = DecodeConfig(gen_length=8, block_length=4, steps=2, stop_on_eos=False)  # blocks of 4, 2 steps each
    per_step = {}
    for length in (4, 40):
        engine = Engine(model, config, EngineConfig(slots=slots))
        seen = _steps(engine)
        engine.run([[5] * length] * slots)
        assert all(s["kv_moved"] == 0 and s["image"] == 0 for s in seen)
        per_step[length] = [s["kv_written"] for s in seen]
        # the first step stores each row's prompt and first block: the rows' own columns
        assert per_step[length][0] == slots * (length + 4) * PER_COLUMN
        assert engine.copies.total["kv_written"] == sum(per_step[length])
        assert engine.copies.max_step == per_step[length][0] and engine.copies.steps == 4
    # then a step stores each row's block (4 columns), folding the finished one in at a block's first step (8):
    # the same with 4 or 40 positions cached, and with the slots' count, never the pool's (slots x 52 columns)
    assert per_step[4][1:] == per_step[40][1:] == [slots * 4 * PER_COLUMN, slots * 8 * PER_COLUMN,
                                                   slots * 4 * PER_COLUMN]


def test_under_load_newcomers_fill_the_holes_and_no_running_row_moves(sharp_sdar):
    """Rows finishing at different steps leave holes among the running ones: while requests wait, newcomers take
    them (their keys are written by their own first forward) instead of the last running row moving into each.
    The pool takes its bound at once (``max_positions``), so nothing grows either. Tokens stay generate's."""
    lengths, gens = [1, 3, 2, 4, 3, 1, 2, 4, 3, 2, 1, 4], [8, 4, 12, 8, 4, 16, 8, 4, 12, 8, 4, 8]
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 60, (n,), generator=g).tolist() for n in lengths]
    config = DecodeConfig(gen_length=8, block_length=4, threshold=0.6, stop_on_eos=False)
    engine = Engine(sharp_sdar, config, EngineConfig(slots=3, max_positions=24))
    ids = [engine.add_request(p, seed=10 + i, gen_length=n) for i, (p, n) in enumerate(zip(prompts, gens))]
    moved, holes_mid, done = [], 0, {}
    while engine.has_unfinished():
        before = [s is not None for s in engine.running]
        holes_mid += any(not a and b for a, b in zip(before, before[1:]))  # a hole before a running row
        waiting = len(engine.waiting)
        done.update({c.request_id: c.rollout for c in engine.step()})
        moved.append((waiting >= before.count(False), engine.copies.step["kv_moved"]))
    assert holes_mid >= 3  # the case at hand happened, several times
    assert all(m == 0 for loaded, m in moved if loaded)
    for rid, p, n in zip(ids, prompts, gens):
        one = generate(sharp_sdar, [p], DecodeConfig(**{**vars(config), "gen_length": n}), seeds=[10 + rid])
        assert torch.equal(done[rid].completion_ids, one.completion_ids), rid
        assert torch.equal(done[rid].step_map, one.step_map), rid


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_image_features_are_written_in_place_once_a_forward_from_the_requests_copy(cache, monkeypatch):
    """A LLaDA-V request's features are made ready once, when queued; a forward of its prompt columns writes each
    of them once into the input embeddings (every step without a cache, a refresh with Fast-dLLM's), never through
    a batch-wide concatenation and scatter; the tokens stay generate's."""
    from llada_v_images import pattern, sharp_llada_v

    from dllm_rl.models.llava_images import IMAGE_TOKEN_INDEX, prompt_images
    from dllm_rl.models.prompt_images import PromptImages

    dlm = sharp_llada_v()
    prompts = [[IMAGE_TOKEN_INDEX, 8, 9], [20, 21, 22, 23], [5, IMAGE_TOKEN_INDEX, 7]]
    widened, pim = prompt_images(dlm, prompts, [[pattern(40, 70, 4)], [], [pattern(90, 50, 1)]])
    config = DecodeConfig(gen_length=8, block_length=4, steps=4, stop_on_eos=False, cache=cache)
    whole = generate(dlm, widened, config, seeds=[3, 4, 5], images=pim)
    per_image = 730 * dlm.config.hidden_size * 4  # 730 positions of float32 features
    engine = Engine(dlm, config, EngineConfig(slots=3))
    seen = _steps(engine)
    monkeypatch.setattr(PromptImages, "splice", lambda *a, **k: pytest.fail("a batch-wide splice per step"))
    got = engine.run(widened, seeds=[3, 4, 5], images=pim)
    assert torch.equal(got.completion_ids, whole.completion_ids) and torch.equal(got.step_map, whole.step_map)
    # 8 steps (2 blocks of 4); two rows hold an image: each forward of their prompts writes 2 x 730 positions
    forwards = 8 if cache == "none" else 2  # Fast-dLLM: a refresh at each block's first step
    assert [s["image"] for s in seen] == ([2 * per_image] * 8 if cache == "none" else
                                          [2 * per_image, 0, 0, 0, 2 * per_image, 0, 0, 0])
    assert engine.copies.total["image"] == forwards * 2 * per_image
