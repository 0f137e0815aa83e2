"""MDPO's Running-Confidence Remasking and the recorded step predictions, on hand-built confidence traces."""

import pytest
import torch

from dllm_rl.config import FieldError
from dllm_rl.sampling import DecodeConfig, Rollout, generate
from dllm_rl.sampling.confidence import left_after, rcr_remask, transfer_counts

# confidence of completion slot j at local step t of a one-block decode of 6 slots in 3 steps (2, 2, 2 commits)
CONF = {0: [0.9, 0.2, 0.6, 0.5, 0.4, 0.8], 1: [0, 0.95, 0.3, 0.85, 0.99, 0], 2: [0, 0, 0.4, 0, 0, 0.7]}
P = 2  # prompt length: completion slot j sits at position P + j


def _token(slot: int, step: int) -> int:
    return (slot + 3 * step) % 10 + 1  # a new token at each re-prediction, never EOS/PAD/MASK


def _rcr_model(fakes):
    """Logits read the state: 6, 4 or 2 masked slots = steps 0, 1, 2; slot j then puts CONF[step][j] on its token."""

    def fn(input_ids, position_ids, logits):
        out = torch.zeros_like(logits)
        for r in range(input_ids.shape[0]):
            step = {6: 0, 4: 1, 2: 2}[int((input_ids[r] == fakes.MASK).sum())]
            for j in range(6):
                p = CONF[step][j] or 0.5
                out[r, P + j, _token(j, step)] = fakes.logit_for(p)
        return out

    return fakes.fake_model(torch.zeros(16, fakes.V), fn=fn)


def test_left_after_and_rcr_remask_hand_computed():
    masked = torch.tensor([10, 6, 2])
    left = torch.stack([left_after(masked, 4, t) for t in range(4)], dim=1)
    counts = torch.stack([transfer_counts(masked, 4, t) for t in range(4)], dim=1)
    assert left.tolist() == [[7, 4, 2, 0], [4, 2, 1, 0], [1, 0, 0, 0]]
    assert (masked[:, None] - counts.cumsum(1)).tolist() == left.tolist()
    running = torch.tensor([[0.9, 0.3, 0.3, 0.1, 0.8]], dtype=torch.float64)
    drawn = torch.tensor([[True, True, True, False, True]])  # slot 3 (0.1) was not decoded here: never re-masked
    assert rcr_remask(running, drawn, torch.tensor([2]))[0].tolist() == [False, True, True, False, False]
    # the tie at 0.3 goes to the lower position
    assert rcr_remask(running, drawn, torch.tensor([1]))[0].tolist() == [False, True, False, False, False]


def test_rcr_remasks_the_lowest_running_confidence_at_each_step(fakes):
    model = _rcr_model(fakes)
    cfg = DecodeConfig(gen_length=6, block_length=6, steps=3, remasking="rcr", stop_on_eos=False)
    out = generate(model, [[1, 2]], cfg, record_steps="sampled")
    # step 0: all 6 filled, keep the 2 most confident (slots 0: 0.9, 5: 0.8), re-mask 1-4
    # step 1: 1-4 filled (0.95, 0.3, 0.85, 0.99); running [0.9, 0.95, 0.3, 0.85, 0.99, 0.8]: re-mask slot 2 (0.3)
    #         and slot 5 (0.8), committed at step 0
    # step 2: 2 and 5 filled (0.4, 0.7); nothing left to re-mask
    assert out.step_masked[0].int().tolist() == [[1] * 6, [0, 1, 1, 1, 1, 0], [0, 0, 1, 0, 0, 1]]
    assert out.step_map[0].tolist() == [0, 1, 2, 1, 1, 2]
    assert out.completion_ids[0].tolist() == [_token(0, 0), _token(1, 1), _token(2, 2), _token(3, 1), _token(4, 1),
                                              _token(5, 2)]
    assert out.confidence[0].tolist() == pytest.approx([0.9, 0.95, 0.4, 0.85, 0.99, 0.7], abs=1e-6)
    assert out.nfe.tolist() == [3]
    # each step's prediction: the state before it with that step's token at every masked slot
    assert out.step_tokens[0, 1].tolist() == [_token(0, 0), _token(1, 1), _token(2, 1), _token(3, 1), _token(4, 1),
                                              _token(5, 0)]
    assert out.step_tokens[0, 2].tolist() == [_token(0, 0), _token(1, 1), _token(2, 2), _token(3, 1), _token(4, 1),
                                              _token(5, 2)]
    assert out.step_confidence[0].flatten().tolist() == pytest.approx(CONF[0] + CONF[1] + CONF[2], abs=1e-6)


def test_low_confidence_keeps_committed_tokens_and_records_predictions(fakes):
    model = _rcr_model(fakes)
    cfg = DecodeConfig(gen_length=6, block_length=6, steps=3, stop_on_eos=False)
    out = generate(model, [[1, 2]], cfg, record_steps="sampled")
    # step 0 commits slots 0 and 5; step 1 slots 4 (0.99) and 1 (0.95); step 2 slots 3 and 2 (confidences of
    # step 2's state, 2 masked: 0.5 where CONF has no entry, 0.4 at slot 2)
    assert out.step_map[0].tolist() == [0, 1, 2, 2, 1, 0]
    assert out.step_masked[0].int().tolist() == [[1] * 6, [0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0]]
    assert out.step_tokens[0, 0].tolist() == [_token(j, 0) for j in range(6)]
    plain = generate(model, [[1, 2]], cfg)
    assert plain.step_tokens is None and torch.equal(plain.completion_ids, out.completion_ids)


def test_rcr_never_remasks_a_finished_block(fakes):
    # block 1 (slots 0-2) is less confident than block 2 (slots 3-5): ranking the whole sequence, as the authors'
    # code does, would re-mask block 1's tokens while block 2 decodes and never refill them
    table = fakes.table_from({P + j: (j + 1, p) for j, p in enumerate([0.3, 0.2, 0.25, 0.9, 0.8, 0.7])})
    cfg = DecodeConfig(gen_length=6, block_length=3, steps=3, remasking="rcr", stop_on_eos=False)
    out = generate(fakes.fake_model(table), [[1, 2]], cfg)
    # block 1: keep 0.3, then 0.3 and 0.25 (slot 1's 0.2 re-masked), then slot 1; block 2 likewise from step 3
    assert out.step_map[0].tolist() == [0, 2, 1, 3, 4, 5]
    assert out.completion_ids[0].tolist() == [1, 2, 3, 4, 5, 6]
    assert out.nfe.tolist() == [6]


def test_rcr_needs_the_static_schedule():
    with pytest.raises(FieldError, match="rcr re-masks on the static schedule"):
        DecodeConfig(gen_length=6, threshold=0.9, remasking="rcr")


def test_recorded_steps_travel_through_select_and_cat(fakes):
    model = _rcr_model(fakes)
    cfg = DecodeConfig(gen_length=6, block_length=6, steps=3, remasking="rcr", stop_on_eos=False)
    a = generate(model, [[1, 2]], cfg, record_steps="sampled")
    short = DecodeConfig(gen_length=6, block_length=6, steps=3, stop_on_eos=False)
    b = generate(_rcr_model(fakes), [[1, 2]], short, record_steps="sampled")
    both = Rollout.cat([a, b]).select([1, 0])
    assert torch.equal(both.step_tokens[1], a.step_tokens[0]) and torch.equal(both.step_masked[0], b.step_masked[0])
    assert both.step_confidence.shape == (2, 3, 6)


def test_the_engine_remasks_as_generate_on_the_hand_computed_trace(fakes):
    from dllm_rl.sampling.engine import Engine, EngineConfig

    cfg = DecodeConfig(gen_length=6, block_length=6, steps=3, remasking="rcr", stop_on_eos=False)
    out = Engine(_rcr_model(fakes), cfg, EngineConfig(slots=2)).run([[1, 2], [1, 2], [1, 2]],
                                                                   record_steps="sampled")
    alone = generate(_rcr_model(fakes), [[1, 2]], cfg, record_steps="sampled")
    for r in range(3):  # the third joins when the first two finish
        assert out.step_map[r].tolist() == [0, 1, 2, 1, 1, 2]  # the hand-computed trace above
        for name in ("completion_ids", "step_map", "confidence", "nfe", "step_tokens", "step_masked"):
            assert torch.equal(getattr(out, name)[r], getattr(alone, name)[0]), (r, name)


def test_the_engine_never_remasks_a_finished_block(fakes):
    from dllm_rl.sampling.engine import Engine, EngineConfig

    table = fakes.table_from({P + j: (j + 1, p) for j, p in enumerate([0.3, 0.2, 0.25, 0.9, 0.8, 0.7])})
    cfg = DecodeConfig(gen_length=6, block_length=3, steps=3, remasking="rcr", stop_on_eos=False)
    out = Engine(fakes.fake_model(table), cfg, EngineConfig(slots=1)).run([[1, 2], [1, 2]])
    assert out.step_map.tolist() == [[0, 2, 1, 3, 4, 5]] * 2 and out.nfe.tolist() == [6, 6]


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_the_engine_remasks_as_one_at_a_time_generate_on_tiny_models(tiny_models, family):
    # sampled, prompts of different lengths joining mid-run, and a request with its own rules beside RCR rows
    from dllm_rl.sampling.engine import Engine, EngineConfig

    model = tiny_models[family]
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 60, (n,), generator=g).tolist() for n in (3, 9, 5, 2, 7)]
    cfg = DecodeConfig(gen_length=8, block_length=4, steps=4, remasking="rcr", temperature=1.0, top_k=20, seed=7)
    plain = DecodeConfig(**{**vars(cfg), "remasking": "low_confidence"})
    engine = Engine(model, cfg, EngineConfig(slots=2))
    ids = [engine.add_request(p, seed=30 + i, config=plain if i == 3 else None, record_steps="sampled")
           for i, p in enumerate(prompts)]
    done = {}
    while engine.has_unfinished():
        done.update({c.request_id: c.rollout for c in engine.step()})
    remasked = 0
    for i, p in enumerate(prompts):
        alone = generate(model, [p], plain if i == 3 else cfg, seeds=[30 + i], record_steps="sampled")
        got = done[ids[i]]
        for name in ("completion_ids", "step_map", "nfe", "step_tokens", "step_masked"):
            assert torch.equal(getattr(got, name), getattr(alone, name)), (i, name)
        # a slot re-masked at some step: masked after a step that had it committed before
        m = alone.step_masked[0]
        remasked += int((m[1:] & ~m[:-1]).sum())
    assert remasked >= 3  # RCR took committed tokens back, so the equality covers the re-masking


def test_the_rl_rollout_section_selects_rcr():
    from dllm_rl.config import load_config
    from dllm_rl.models import build_model, tiny_config
    from dllm_rl.rl.config import RLConfig, decode_config

    model = build_model("llada", tiny_config("llada", vocab_size=32, hidden_size=16, intermediate_size=32, num_heads=2,
                                              num_kv_heads=1, num_layers=1), seed=0)
    cfg = load_config(RLConfig, None, ["model.path=m", "rollout.remasking=rcr", "rollout.gen_length=8",
                                       "rollout.steps=4", "rollout.cache=none"])
    assert decode_config(cfg, model).remasking == "rcr"


def test_early_stop_under_rcr_waits_for_the_block_whose_tokens_it_may_take_back(fakes):
    # step 0 keeps slots 0 (token 1) and 1 (EOS): an answer that looks decided; step 1 re-masks both, step 2
    # fills them with 7 and 8: the answer has no EOS at all
    from dllm_rl.sampling.engine import Engine, EngineConfig

    plan = {6: [(1, .9), (fakes.EOS, .8), (2, .3), (3, .3), (4, .3), (5, .3)],
            4: [(1, .5), (fakes.EOS, .5), (2, .95), (3, .95), (4, .95), (5, .95)],
            2: [(7, .99), (8, .99), (2, .5), (3, .5), (4, .5), (5, .5)]}

    def fn(input_ids, position_ids, logits):
        out = torch.zeros_like(logits)
        for r in range(input_ids.shape[0]):
            for j, (tok, p) in enumerate(plan[int((input_ids[r] == fakes.MASK).sum())]):
                out[r, P + j, tok] = fakes.logit_for(p)
        return out

    model = fakes.fake_model(torch.zeros(16, fakes.V), fn=fn)
    cfg = DecodeConfig(gen_length=6, block_length=6, steps=3, remasking="rcr", stop_on_eos=False)
    alone = generate(model, [[1, 2]], cfg)
    assert alone.completion_ids[0].tolist() == [7, 8, 2, 3, 4, 5] and alone.finish_reason == ["length"]
    for early in (False, True):
        out = Engine(model, cfg, EngineConfig(slots=1, early_stop=early)).run([[1, 2]])
        assert torch.equal(out.completion_ids, alone.completion_ids) and out.finish_reason == ["length"], early


def test_a_stream_under_rcr_sends_only_what_no_later_step_takes_back():
    # what `dllm-rl serve` streams (and checks stop sequences on): committed tokens without a gap, and under RCR
    # only those of finished blocks
    from dllm_rl.models import build_model, tiny_config
    from dllm_rl.sampling.engine import Engine, EngineConfig
    from dllm_rl.sampling.sequence import settled

    kw = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    model = build_model("llada", tiny_config("llada", **kw), seed=1)
    with torch.no_grad():
        model.model.lm_head.weight.mul_(20.0)
    eos = model.eos_token_id
    taken_back, streamed = 0, 0
    for gen, seed in [(8, s) for s in range(10)] + [(16, s) for s in range(5)]:  # one block of 8, or two
        cfg = DecodeConfig(gen_length=gen, block_length=8, steps=8, remasking="rcr", temperature=1.0,
                           stop_on_eos=False)
        engine = Engine(model, cfg, EngineConfig(slots=1))
        rid = engine.add_request([5, 9, 11, 3], seed=seed)
        sent, naive = [], []
        while not (done := engine.step()):
            seq = engine.running[0]
            tokens, todo = engine.completions([rid])[rid]
            sent = max(sent, settled(tokens, todo, eos, seq.final_slots())[0], key=len)
            naive = max(naive, settled(tokens, todo, eos)[0], key=len)
        answer = done[0].rollout.completion_ids[0][done[0].rollout.completion_mask[0]].tolist()
        assert answer[:len(sent)] == sent, (gen, seed)
        taken_back += answer[:len(naive)] != naive
        streamed += len(sent) > 0
    assert streamed > 0  # the first block's answer tokens are sent before the second block ends
    assert taken_back > 0  # reading every committed token as final would have streamed tokens RCR took back
