"""Decoding rules on hand-built models whose logits are a fixed function of position: exact commit order,
counts per step, thresholds, confidence rules, EOS stopping and step_map values."""

import pytest
import torch

from dllm_rl.sampling import DecodeConfig, generate


def test_static_commit_order_and_counts(fakes):
    # Prompt of 2 tokens: completion positions 2..9, two blocks of 4, 3 steps per block -> counts [2, 1, 1].
    rows = {2: (3, 0.62), 3: (4, 0.2), 4: (5, 0.61), 5: (6, 0.6),
            6: (7, 0.3), 7: (8, 0.7), 8: (9, 0.5), 9: (1, 0.9)}
    model = fakes.fake_model(fakes.table_from(rows))
    r = generate(model, [[11, 12]], DecodeConfig(gen_length=8, block_length=4, steps=3))
    assert r.completion_ids[0].tolist() == [3, 4, 5, 6, 7, 8, 9, 1]
    # block 0: step 0 -> pos 2, 4 (0.62, 0.61); step 1 -> pos 5; step 2 -> pos 3
    # block 1: step 3 -> pos 9, 7; step 4 -> pos 8; step 5 -> pos 6
    assert r.step_map[0].tolist() == [0, 2, 0, 1, 5, 3, 4, 3]
    assert r.nfe.tolist() == [6]
    assert r.confidence[0].tolist() == pytest.approx([0.62, 0.2, 0.61, 0.6, 0.3, 0.7, 0.5, 0.9], abs=1e-6)
    assert r.finish_reason == ["length"] and r.completion_mask.all()
    assert r.prompt_ids.tolist() == [[11, 12]] and r.prompt_mask.all()


def test_static_schedule_splits_evenly_and_skips_empty_steps(fakes):
    model = fakes.fake_model(fakes.table_from({}))  # confidence falls with the position: left to right
    r = generate(model, [[1]], DecodeConfig(gen_length=10, block_length=10, steps=4))
    # 10 masks over 4 steps: 3, 3, 2, 2 tokens, highest confidence (the lowest positions) first
    assert r.step_map[0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    r = generate(model, [[1]], DecodeConfig(gen_length=8, block_length=4, steps=6))
    # more steps than masks: one token per step, the empty steps are not spent
    assert r.step_map[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7] and r.nfe.tolist() == [8]


def test_dynamic_threshold_commits_all_above_and_at_least_one(fakes):
    rows = {1: (2, 0.95), 2: (3, 0.5), 3: (4, 0.92), 4: (5, 0.3), 5: (6, 0.99), 6: (7, 0.97), 7: (8, 0.91),
            8: (9, 0.96)}
    model = fakes.fake_model(fakes.table_from(rows))
    r = generate(model, [[0]], DecodeConfig(gen_length=8, block_length=4, threshold=0.9))
    # block 0: step 0 commits 0.95 and 0.92; step 1 the best left (0.5); step 2 the last (0.3)
    # block 1: every confidence > 0.9 -> one step
    assert r.step_map[0].tolist() == [0, 1, 0, 2, 3, 3, 3, 3]
    assert r.nfe.tolist() == [4]
    r = generate(model, [[0]], DecodeConfig(gen_length=8, block_length=4, threshold=1.0))
    assert r.step_map[0].tolist() == [0, 2, 1, 3, 4, 5, 7, 6] and r.nfe.tolist() == [8]


def _probs_table(per_pos: dict[int, list[float]], vocab: int, n_pos: int = 32) -> torch.Tensor:
    table = torch.zeros(n_pos, vocab)
    for pos, probs in per_pos.items():
        p = torch.tensor(probs + [(1 - sum(probs)) / (vocab - len(probs))] * (vocab - len(probs)))
        table[pos] = p.log()
    return table


@pytest.mark.parametrize(
    "rule, expected",
    [
        ("prob", [0, 1, 2]),  # top-1 probabilities 0.6 > 0.5 > 0.4
        ("margin", [1, 0, 2]),  # margins 0.6-0.35=0.25, 0.5-0.05=0.45, 0.4-0.39=0.01
        ("entropy", [0, 2, 1]),  # exp(-H): H = 0.96, 2.04, 1.13 nats
    ],
)
def test_confidence_rules_order_commits(fakes, rule, expected):
    vocab = fakes.V
    table = _probs_table({1: [0.6, 0.35], 2: [0.5, 0.05, 0.05], 3: [0.4, 0.39, 0.2]}, vocab)
    model = fakes.fake_model(table)
    r = generate(model, [[0]], DecodeConfig(gen_length=3, block_length=3, confidence=rule))
    assert r.step_map[0].tolist() == expected
    assert r.completion_ids[0].tolist() == [0, 0, 0]
    probs = table[1:4].softmax(-1).double()
    h = -(probs * probs.log()).sum(-1)
    want = {"prob": probs.max(-1).values, "margin": probs.topk(2).values[:, 0] - probs.topk(2).values[:, 1],
            "entropy": torch.exp(-h)}[rule]
    assert r.confidence[0].tolist() == pytest.approx(want.tolist(), rel=1e-5)


def test_random_confidence_uses_the_sequence_generator(fakes):
    model = fakes.fake_model(fakes.table_from({}))
    r = generate(model, [[0]], DecodeConfig(gen_length=4, block_length=4, confidence="random"), seeds=[7])
    g = torch.Generator().manual_seed(7)
    order, left, steps = [], [0, 1, 2, 3], {}
    for step in range(4):  # one draw of 4 scores per step, the best remaining slot is committed
        u = torch.rand(4, generator=g, dtype=torch.float64)
        best = max(left, key=lambda j: (u[j].item(), -j))
        steps[best] = step
        left.remove(best)
        order.append(best)
    assert r.step_map[0].tolist() == [steps[j] for j in range(4)]


def test_eos_block_stops_the_sequence_and_fills_eos(fakes):
    eos = fakes.EOS
    rows = {p: (eos, 0.9) for p in range(6, 40)}  # prompt 2 tokens; EOS from completion slot 4 on
    model = fakes.fake_model(fakes.table_from(rows))
    cfg = DecodeConfig(gen_length=16, block_length=4, steps=4)
    r = generate(model, [[1, 2]], cfg)
    ids = r.completion_ids[0].tolist()
    assert ids[:4] == [2, 3, 4, 5] and ids[4:] == [eos] * 12
    assert r.step_map[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7] + [-1] * 8  # blocks 2, 3 never decoded
    assert r.nfe.tolist() == [8] and r.finish_reason == ["eos"]
    assert r.completion_mask[0].tolist() == [True] * 5 + [False] * 11
    r = generate(model, [[1, 2]], DecodeConfig(gen_length=16, block_length=4, steps=4, stop_on_eos=False))
    assert r.nfe.tolist() == [16] and (r.step_map >= 0).all() and r.finish_reason == ["eos"]


def test_eos_inside_a_block_does_not_stop(fakes):
    eos = fakes.EOS
    model = fakes.fake_model(fakes.table_from({3: (eos, 0.9)}))  # EOS at slot 2 only
    r = generate(model, [[1]], DecodeConfig(gen_length=8, block_length=4), tokenizer=None)
    assert r.completion_ids[0, 2].item() == eos and r.nfe.tolist() == [8]
    assert r.completion_mask[0].tolist() == [True, True, True] + [False] * 5
    assert r.finish_reason == ["eos"]


def test_block_model_layout_prompt_tail_and_rounding(fakes):
    # block_size 4, prompts of 6 and 4 tokens: the 6-token prompt shares its block 1 with 2 completion slots.
    model = fakes.fake_model(fakes.table_from({}), family="sdar", block_size=4)
    cfg = DecodeConfig(gen_length=8, block_length=999)  # block models ignore block_length
    r = generate(model, [[1] * 6, [2] * 4], cfg)
    # row 0: ceil((2 + 8) / 4) = 3 blocks -> 10 completion slots; row 1: 2 blocks -> 8 slots
    assert r.completion_ids.shape == (2, 10)
    assert r.step_map[0].tolist() == list(range(10))
    assert r.step_map[1].tolist() == list(range(8)) + [-1, -1]
    assert r.completion_ids[0].tolist() == [(p % 10) for p in range(6, 16)]  # token = position % 10
    assert r.completion_ids[1].tolist() == [(p % 10) for p in range(4, 12)] + [fakes.PAD] * 2
    assert r.nfe.tolist() == [10, 8]
    assert r.prompt_ids.tolist() == [[1] * 6, [fakes.PAD] * 2 + [2] * 4]
    # forwards: [prompt head | block] folded, then the block alone; the cache holds finished blocks only
    q = model.model.query_lengths
    assert q[0] == 8 and set(q[1:]) <= {4, 8}
    # only the current block's 4 columns reach the LM head, also when the finished block is folded in
    assert model.model.kept_lengths == [4] * len(q)


@pytest.mark.parametrize("cache, expect", [("none", "full"), ("prefix", "suffix"), ("dual", "block")])
def test_cache_modes_forward_the_documented_columns(fakes, cache, expect):
    model = fakes.fake_model(fakes.table_from({}))
    generate(model, [[1, 2, 3]], DecodeConfig(gen_length=12, block_length=4, steps=2, cache=cache))
    q = model.model.query_lengths
    total = 3 + 12
    if expect == "full":
        assert q == [total] * 6
    elif expect == "suffix":  # refresh with everything, then [block start, end)
        assert q == [total, 12, total, 8, total, 4]
    else:  # refresh, then the block alone
        assert q == [total, 4] * 3
    # the LM head sees the block's 4 columns (+ the last query column, for ``last_raw_logits``), never all
    kept = model.model.kept_lengths
    assert kept == ([5, 4] * 3 if expect == "block" else [5] * 6)


def test_bad_inputs_fail_before_any_forward(fakes):
    model = fakes.fake_model(fakes.table_from({}, n_pos=20))
    calls = model.model.query_lengths
    with pytest.raises(ValueError, match="context is 20"):
        generate(model, [[1] * 10], DecodeConfig(gen_length=12, block_length=4))
    with pytest.raises(ValueError, match=r"multiple of block_length \(4\)"):
        generate(model, [[1]], DecodeConfig(gen_length=6, block_length=4))
    with pytest.raises(ValueError, match="empty"):
        generate(model, [[1], []], DecodeConfig(gen_length=4, block_length=4))
    with pytest.raises(ValueError, match="vocabulary"):
        generate(model, [[99]], DecodeConfig(gen_length=4, block_length=4))
    with pytest.raises(ValueError, match="one seed per prompt"):
        generate(model, [[1]], DecodeConfig(gen_length=4, block_length=4), seeds=[1, 2])
    sdar = fakes.fake_model(fakes.table_from({}), family="sdar", block_size=4)
    with pytest.raises(ValueError, match=r"block_size \(4\)"):
        generate(sdar, [[1]], DecodeConfig(gen_length=6))
    assert calls == [] and sdar.model.query_lengths == []
    for bad, msg in [({"threshold": 0.0}, "threshold"), ({"threshold": 1.5}, "threshold"),
                     ({"temperature": -0.1}, "temperature"), ({"steps": 2, "threshold": 0.5}, "not both"),
                     ({"confidence": "low"}, "confidence"), ({"cache": "full"}, "cache"), ({"top_p": 0.0}, "top_p")]:
        with pytest.raises(ValueError, match=msg):
            DecodeConfig(**bad)


def test_progress_bar_does_not_change_the_result(fakes, capsys):
    model = fakes.fake_model(fakes.table_from({}))
    cfg = DecodeConfig(gen_length=8, block_length=4, steps=2)
    quiet = generate(model, [[1, 2]], cfg)
    loud = generate(model, [[1, 2]], cfg, progress=True)
    assert torch.equal(quiet.step_map, loud.step_map) and torch.equal(quiet.completion_ids, loud.completion_ids)


def test_sub_blocks_finish_left_to_right_under_the_threshold(fakes):
    """Fast-dLLM v2's sub-blocks: only the first sub-block still holding masks commits, by the threshold rule."""
    rows = {1: (2, 0.5), 2: (3, 0.95), 3: (4, 0.3), 4: (5, 0.92), 5: (6, 0.99), 6: (7, 0.97), 7: (8, 0.2),
            8: (9, 0.96)}
    model = fakes.fake_model(fakes.table_from(rows))
    r = generate(model, [[0]], DecodeConfig(gen_length=8, block_length=8, threshold=0.9, sub_block=4))
    # sub-block 0 (positions 1-4): step 0 commits 0.95 and 0.92, step 1 the best left (0.5), step 2 the last;
    # sub-block 1 (5-8): step 3 commits 0.99, 0.97, 0.96, step 4 the last (0.2)
    assert r.step_map[0].tolist() == [1, 0, 2, 0, 3, 3, 4, 3] and r.nfe.tolist() == [5]
    assert r.completion_ids[0].tolist() == [2, 3, 4, 5, 6, 7, 8, 9]
    whole = generate(model, [[0]], DecodeConfig(gen_length=8, block_length=8, threshold=0.9))
    assert whole.step_map[0].tolist() == [1, 0, 2, 0, 0, 0, 3, 0] and whole.nfe.tolist() == [4]
    same = generate(model, [[0]], DecodeConfig(gen_length=8, block_length=8, threshold=0.9, sub_block=8))
    assert torch.equal(same.step_map, whole.step_map)


def test_current_sub_block_keeps_each_rows_first_unfinished_sub_block():
    from dllm_rl.sampling.confidence import current_sub_block

    cand = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1], [0, 0, 0, 0, 0, 1, 0, 1], [0] * 8], dtype=torch.bool)
    got = current_sub_block(cand, 4)
    assert got.int().tolist() == [[0, 0, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1, 0, 1], [0] * 8]


def test_sub_block_needs_a_threshold_and_must_divide_the_block(fakes):
    from dllm_rl.config import FieldError
    from dllm_rl.errors import UserError

    with pytest.raises(FieldError, match="sub_block: sub-blocks need the dynamic schedule: set threshold"):
        DecodeConfig(gen_length=8, block_length=8, steps=4, sub_block=4)
    model = fakes.fake_model(fakes.table_from({}))
    with pytest.raises(UserError, match=r"sub_block \(3\) must divide block_length \(8\)"):
        generate(model, [[0]], DecodeConfig(gen_length=8, block_length=8, threshold=0.9, sub_block=3))


@pytest.mark.parametrize("cache, widths", [("none", [2, 1, 1, 1]), ("prefix", [2, 2, 2, 2])])
def test_a_batch_forwards_only_the_rows_still_decoding_when_nothing_is_cached(fakes, cache, widths):
    # Row 0 (a prompt of 6 tokens: completion positions 6..9, all 99% sure) decodes its block of 4 in one step
    # under the threshold; row 1 (a prompt of 1: positions 1..4, ~0.5 each) one slot per step, 4 steps. Without
    # a cache the three steps after the first forward row 1 alone (the batch costs 1 + 4 row-forwards, its rows'
    # NFE); a cached mode holds both rows' caches and forwards both.
    seen = []

    def fn(input_ids, position_ids, logits):
        seen.append(int(input_ids.shape[0]))
        return logits

    model = fakes.fake_model(fakes.table_from({p: (p, 0.99) for p in range(6, 10)}), fn=fn)
    config = DecodeConfig(gen_length=4, block_length=4, threshold=0.9, cache=cache)
    r = generate(model, [[5] * 6, [5]], config)
    assert seen == widths
    assert r.nfe.tolist() == [1, 4]
    assert r.step_map.tolist() == [[0, 0, 0, 0], [0, 1, 2, 3]]
    assert r.completion_ids.tolist() == [[6, 7, 8, 9], [1, 2, 3, 4]]
    alone = generate(model, [[5]], config)
    assert torch.equal(alone.completion_ids[0], r.completion_ids[1]) and torch.equal(alone.step_map[0], r.step_map[1])
