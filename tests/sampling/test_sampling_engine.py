"""The continuous-batching engine: the same tokens, step maps and NFE as one-at-a-time `generate`, whoever shares
the slots; memory bounded by the slots, not the queue; early stop; the serving API (ids, abort, errors)."""

import pytest
import torch

from dllm_rl.errors import UserError
from dllm_rl.models import DiffusionLM, build_model, tiny_config
from dllm_rl.sampling import DecodeConfig, generate, generate_batched
from dllm_rl.sampling.engine import Engine, EngineConfig
from dllm_rl.sampling.sequence import settled

LENGTHS = [1, 3, 5, 6, 9, 2, 7, 4, 11, 8]  # prompt lengths, most not multiples of the block
GEN = [8, 12, 4, 16, 8, 4, 12, 8, 16, 4]  # each request's own generation length


def _prompts(lengths, vocab=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def _with_frequent_eos(model, prompts, config):
    """The model with its most generated token as EOS, so rows stop at different blocks (EOS stops)."""
    free = generate(model, prompts, DecodeConfig(**{**vars(config), "stop_on_eos": False}))
    eos = int(torch.bincount(free.completion_ids[free.step_map >= 0]).argmax())
    return DiffusionLM(model.model, model.family, {**model.published_config, "eos_token_id": eos})


def _serve(engine, prompts, gens, seeds):
    """Submit every request, step until all are done; returns {id: rollout} and the ids running at each step."""
    ids = [engine.add_request(p, seed=s, gen_length=g) for p, g, s in zip(prompts, gens, seeds)]
    done, running = {}, []
    while engine.has_unfinished():
        finished = engine.step()
        running.append({s.request_id for s in engine.running if s is not None} | {c.request_id for c in finished})
        done.update({c.request_id: c.rollout for c in finished})
    return ids, done, running


@pytest.mark.parametrize("family", ["sdar", "llada"])
@pytest.mark.parametrize("decoding", [dict(steps=2), dict(threshold=0.6),
                                      dict(temperature=0.8, top_k=20, top_p=0.95, steps=2),
                                      dict(temperature=1.0, confidence="random", threshold=0.3)])
def test_engine_equals_one_at_a_time_generate(tiny_models, sharp_sdar, family, decoding):
    model = sharp_sdar if family == "sdar" else tiny_models[family]
    prompts = _prompts(LENGTHS, seed=1)
    config = DecodeConfig(gen_length=8, block_length=4, **decoding)
    if family == "sdar":  # (the random LLaDA writes one token everywhere: as EOS it would end every row at once)
        model = _with_frequent_eos(model, prompts, config)
    seeds = [100 + i for i in range(len(prompts))]
    engine = Engine(model, config, EngineConfig(slots=3))
    ids, done, running = _serve(engine, prompts, GEN, seeds)
    assert ids == list(range(10)) and sorted(done) == ids
    # the queue is longer than the slots: requests joined while others were half-way, never more than 3 at once
    assert max(len(r) for r in running) == 3 and len(running) > 2
    assert any(r - running[0] and r & running[0] for r in running)
    for rid, p, g, s in zip(ids, prompts, GEN, seeds):
        one = generate(model, [p], DecodeConfig(**{**vars(config), "gen_length": g}), seeds=[s])
        got = done[rid]
        assert torch.equal(got.completion_ids, one.completion_ids), rid
        assert torch.equal(got.step_map, one.step_map), rid
        assert torch.equal(got.nfe, one.nfe), rid
        assert torch.equal(got.prompt_ids, one.prompt_ids) and got.finish_reason == one.finish_reason
        assert torch.allclose(got.confidence, one.confidence, atol=1e-6)
        assert torch.allclose(got.entropy, one.entropy, atol=1e-5) and bool((got.entropy > 0).any())
    nfe = torch.cat([done[i].nfe for i in ids])
    assert len(set(nfe.tolist())) > 3  # rows took very different numbers of steps
    if family == "sdar":
        assert any(done[i].finish_reason == ["eos"] for i in ids)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("decoding", [dict(steps=2), dict(temperature=1.0, threshold=0.5)])
def test_fast_dllm_caches_decode_as_one_at_a_time_generate(tiny_models, family, cache, decoding):
    """Fast-dLLM's prefix and dual caches in the engine, per slot: each request refreshes its slot at its own
    blocks' first steps and decodes the rest of each block from it, whoever shares the steps (3 slots, 10 requests
    of different prompt and completion lengths joining mid-run); tokens, step maps and NFE equal ``generate`` with
    the same cache, one prompt at a time; a step forwards the mid-block rows' blocks only (dual)."""
    model = tiny_models[family]
    prompts = _prompts(LENGTHS, seed=3)
    config = DecodeConfig(gen_length=8, block_length=4, cache=cache, **decoding)
    seeds = [200 + i for i in range(len(prompts))]
    engine = Engine(model, config, EngineConfig(slots=3))
    widths = []
    real = model.forward
    model.forward = lambda ids, *a, **k: widths.append(ids.shape[1]) or real(ids, *a, **k)
    try:
        ids, done, running = _serve(engine, prompts, GEN, seeds)
    finally:
        del model.forward
    assert max(len(r) for r in running) == 3 and any(r - running[0] and r & running[0] for r in running)
    for rid, p, g, s in zip(ids, prompts, GEN, seeds):
        one = generate(model, [p], DecodeConfig(**{**vars(config), "gen_length": g}), seeds=[s])
        assert torch.equal(done[rid].completion_ids, one.completion_ids), rid
        assert torch.equal(done[rid].step_map, one.step_map), rid
        assert torch.equal(done[rid].nfe, one.nfe), rid
    if cache == "dual":  # the cached forwards' queries: one block (the refreshes forward whole canvases)
        assert widths.count(4) > len(widths) // 3 and max(widths) > 4


@pytest.mark.parametrize("family", ["sdar", "llada"])
@pytest.mark.parametrize("kind", ["sampled", "greedy"])
def test_per_step_records_equal_generates(tiny_models, family, kind):
    """``record_steps`` through the engine (MDPO's and EGSPO's rollouts): each request's per-step predictions and
    masks equal what ``generate`` records for it alone (confidences to float rounding), whoever shares its steps,
    and a fixed batch's through ``generate_batched``; a request its prefill fills keeps an empty record."""
    model = tiny_models[family]
    prompts = _prompts(LENGTHS[:7], seed=6)
    config = DecodeConfig(gen_length=8, block_length=4, temperature=1.0, threshold=0.5, stop_on_eos=False)
    seeds = [300 + i for i in range(len(prompts))]
    got = Engine(model, config, EngineConfig(slots=3)).run(prompts, seeds, record_steps=kind)
    for i, (p, s) in enumerate(zip(prompts, seeds)):
        one = generate(model, [p], config, seeds=[s], record_steps=kind)
        _, steps, width = one.step_tokens.shape  # (a block model's completion may start inside the prompt's block)
        assert steps == int(one.nfe) and steps > 1
        assert torch.equal(got.step_tokens[i : i + 1, :steps, :width], one.step_tokens), i
        assert torch.equal(got.step_masked[i : i + 1, :steps, :width], one.step_masked), i
        assert torch.allclose(got.step_confidence[i : i + 1, :steps, :width], one.step_confidence, atol=1e-6), i
        assert not got.step_masked[i, steps:].any() and not got.step_masked[i, :, width:].any()  # padding
    fixed = generate_batched(model, prompts, config, seeds, batch_size=7, record_steps=kind)
    through = generate_batched(model, prompts, config, seeds, record_steps=kind, engine=EngineConfig(slots=2))
    assert torch.equal(through.step_tokens, fixed.step_tokens) and torch.equal(through.step_masked, fixed.step_masked)
    assert torch.allclose(through.step_confidence, fixed.step_confidence, atol=1e-6)
    width = generate(model, [prompts[0]], config).completion_ids.shape[1]
    filled = Engine(model, config, EngineConfig(slots=1)).run([prompts[0]], prefill=[dict.fromkeys(range(width), 5)],
                                                               record_steps=kind)
    assert filled.step_tokens.shape == (1, 0, width) and int(filled.nfe) == 0


@pytest.mark.parametrize("family", ["sdar", "dream", "llada2", "sdar_moe"])
def test_run_returns_the_fixed_batch_rollout_in_input_order(tiny_models, family):
    model = tiny_models.get(family) or build_model(family, tiny_config(family, vocab_size=64, hidden_size=32,
                                                                          num_layers=2, num_heads=2, num_kv_heads=1,
                                                                          intermediate_size=64), seed=1)
    prompts = _prompts(LENGTHS[:7], seed=3)
    config = DecodeConfig(gen_length=8, block_length=4, temperature=1.0, seed=11)
    whole = generate(model, prompts, config)
    got = Engine(model, config, EngineConfig(slots=2)).run(prompts)
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "step_map", "nfe"):
        assert torch.equal(getattr(got, name), getattr(whole, name)), name
    assert got.finish_reason == whole.finish_reason and got.block_size == whole.block_size


def test_a_run_decodes_in_eval_mode_and_switches_the_mode_once(tiny_models, monkeypatch):
    model = tiny_models["sdar"]
    prompts = _prompts(LENGTHS[:5], seed=5)
    config = DecodeConfig(gen_length=8, block_length=4, temperature=1.0, seed=2)
    modes, switches = [], []
    forward = DiffusionLM.forward
    monkeypatch.setattr(DiffusionLM, "forward", lambda self, *a, **k: modes.append(self.training) or forward(
        self, *a, **k))
    monkeypatch.setattr(DiffusionLM, "eval", lambda self: switches.append("eval") or self.train(False))
    train = DiffusionLM.train
    monkeypatch.setattr(DiffusionLM, "train", lambda self, mode=True: switches.append(mode) or train(self, mode))
    was = model.training
    model.train()
    switches.clear()
    try:
        rollout = Engine(model, config, EngineConfig(slots=2)).run(prompts)
        assert model.training and modes and not any(modes)  # every forward in eval mode, training mode after
        assert switches == ["eval", False, True]  # once for the run, not per step (rollout.nfe.max() steps here)
        assert int(rollout.nfe.max()) > 1
        model.eval()
        modes.clear()
        switches.clear()
        generate(model, prompts, config)
        Engine(model, config, EngineConfig(slots=2)).run(prompts)
        assert not model.training and modes and not any(modes)
        assert switches == []  # a model in eval mode is left as it is
    finally:
        train(model, was)


def test_the_kv_pool_is_bounded_by_the_slots_not_the_queue(tiny_models):
    """The pool is the engine's whole KV memory: a step reads it in place (no gathered copy of the running rows'
    caches; the view itself is checked in test_sampling_kv_cache)."""
    model = tiny_models["sdar"]  # 2 layers, 1 KV head of 16 dims, float32
    config = DecodeConfig(gen_length=8, threshold=0.9, stop_on_eos=False)
    prompt = _prompts([10], seed=4)[0]  # 10 tokens + 8 + 2 (rounded to the block of 4): 20 positions

    def pool_after(slots, queue):
        engine = Engine(model, config, EngineConfig(slots=slots))
        engine.run([prompt] * queue)
        return engine.cache.nbytes()

    pool = 2 * 2 * 20 * 16 * 4  # layers x (keys, values) x positions x head dim x bytes, per slot
    assert pool_after(2, 2) == pool_after(2, 20) == 2 * pool  # ten times the slots queued: the same pool
    assert pool_after(4, 20) == 4 * pool
    # with max_positions the pool takes its bound at the first step and never grows past it
    engine = Engine(model, config, EngineConfig(slots=2, max_positions=24))
    engine.add_request(prompt)
    engine.step()
    assert engine.cache.nbytes() == 2 * pool * 24 // 20
    engine.run([prompt] * 6)
    assert engine.cache.nbytes() == 2 * pool * 24 // 20
    # run() knows every canvas: the pool takes the widest at once, never regrown (a growth holds old and new)
    engine = Engine(model, config, EngineConfig(slots=2))
    grew = []
    real = engine.cache.reserve
    engine.cache.reserve = lambda cols: grew.append(bool(engine.cache.keys) and cols > engine.cache.capacity) or \
        real(cols)
    engine.run([prompt[:2], prompt[:3], prompt, prompt[:1]])  # the widest joins last
    assert not any(grew) and engine.cache.nbytes() == 2 * pool


def test_early_stop_ends_a_decided_answer_mid_block(fakes):
    # Prompt [1, 2]; completion slots 0-3 are confident words, slot 4 (position 6) an EOS, the rest not EOS.
    eos = fakes.EOS
    rows = {p: (p % 10, 0.99 - p / 1000) for p in range(2, 6)} | {6: (eos, 0.9)}
    model = fakes.fake_model(fakes.table_from(rows))
    config = DecodeConfig(gen_length=16, block_length=8)  # one token per step, most confident first
    ref = generate(model, [[1, 2]], config)
    assert ref.nfe.tolist() == [16]  # block 0 is not all EOS: the published rule decodes on
    early = Engine(model, config, EngineConfig(slots=2, early_stop=True)).run([[1, 2]])
    assert early.nfe.tolist() == [5]  # slots 0-3, then the EOS: the answer is decided after 5 steps
    assert early.step_map[0].tolist() == [0, 1, 2, 3, 4] + [-1] * 11
    assert early.completion_ids[0].tolist() == [2, 3, 4, 5, eos] + [eos] * 11
    assert ref.completion_ids[0, 5:].ne(eos).any()  # the published sampler writes other tokens after the EOS
    # the answer is the same: tokens up to the first EOS, the mask, the finish reason
    assert torch.equal(early.completion_mask, ref.completion_mask)
    assert torch.equal(early.completion_ids[early.completion_mask], ref.completion_ids[ref.completion_mask])
    assert early.finish_reason == ref.finish_reason == ["eos"]
    off = Engine(model, config, EngineConfig(slots=2)).run([[1, 2]])
    assert torch.equal(off.completion_ids, ref.completion_ids) and off.nfe.tolist() == [16]


def test_early_stop_waits_for_the_slots_before_the_eos(fakes):
    # The EOS (position 3) is the most confident: committed first, but slots before it are still masked.
    eos = fakes.EOS
    model = fakes.fake_model(fakes.table_from({3: (eos, 0.99)}))
    config = DecodeConfig(gen_length=8, block_length=8)
    early = Engine(model, config, EngineConfig(early_stop=True)).run([[1]])
    assert early.step_map[0].tolist() == [1, 2, 0, -1, -1, -1, -1, -1] and early.nfe.tolist() == [3]
    ref = generate(model, [[1]], config)
    assert torch.equal(early.completion_mask, ref.completion_mask) and ref.nfe.tolist() == [8]


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_early_stop_leaves_a_request_without_stop_on_eos_to_its_full_length(fakes, family):
    # The answer of prompt [1, 2] is decided after 5 steps (slots 0-3, then the EOS at slot 4), but a request that
    # asked stop_on_eos=False decodes its whole length as generate does: its tokens, step map and NFE equal it,
    # while a request beside it with stop_on_eos stops early.
    rows = {p: (p % 10, 0.99 - p / 1000) for p in range(2, 6)} | {6: (fakes.EOS, 0.9)}
    model = fakes.fake_model(fakes.table_from(rows), family)
    free = DecodeConfig(gen_length=16, block_length=4, stop_on_eos=False)
    ref = generate(model, [[1, 2]], free)
    assert ref.nfe.tolist() == [16 + 2 * (family == "sdar")] and ref.finish_reason == ["eos"], ref.nfe
    engine = Engine(model, free, EngineConfig(slots=2, early_stop=True))
    ids = [engine.add_request([1, 2]), engine.add_request([1, 2], config=DecodeConfig(**{**vars(free),
                                                                                       "stop_on_eos": True}))]
    done = {}
    while engine.has_unfinished():
        done.update({c.request_id: c.rollout for c in engine.step()})
    kept, stopped = done[ids[0]], done[ids[1]]
    for name in ("completion_ids", "completion_mask", "step_map", "nfe"):
        assert torch.equal(getattr(kept, name), getattr(ref, name)), name
    assert kept.finish_reason == ["eos"]
    assert stopped.nfe.tolist() == [5] and stopped.step_map[0, :5].tolist() == [0, 1, 2, 3, 4]
    assert bool((stopped.step_map[0, 5:] == -1).all()) and stopped.finish_reason == ["eos"]


def test_abort_frees_the_slot_and_errors_name_the_request(fakes, tiny_models):
    model = fakes.fake_model(fakes.table_from({}))
    engine = Engine(model, DecodeConfig(gen_length=8, block_length=4), EngineConfig(slots=1))
    a, b, c = (engine.add_request([1, 2]) for _ in range(3))
    engine.step()
    assert [s.request_id for s in engine.running] == [a] and len(engine.waiting) == 2
    assert engine.abort(a) and engine.abort(c) and not engine.abort(99)
    finished = []
    while engine.has_unfinished():
        finished += engine.step()
    assert [f.request_id for f in finished] == [b] and finished[0].rollout.nfe.tolist() == [8]
    with pytest.raises(UserError, match=r"request 3 has token ids outside the model's vocabulary"):
        engine.add_request([99])
    with pytest.raises(UserError, match=r"gen_length \(6\) must be a multiple of block_length \(4\)"):
        engine.add_request([1], gen_length=6)
    # 10 prompt tokens + 8 completion slots: 20 positions for the block model (its last prompt block's 2 tokens share
    # the first decoded block, rounded up to the block of 4), 18 for LLaDA; both refuse past max_positions
    sdar = Engine(tiny_models["sdar"], DecodeConfig(gen_length=8), EngineConfig(max_positions=19))
    with pytest.raises(UserError, match=r"request 0 has 10 tokens; .* needs 20 positions but max_positions is 19"):
        sdar.add_request(list(range(10)))
    with pytest.raises(UserError, match=r"prompt 1 has 10 tokens; .* but max_positions is 19"):
        sdar.run([[1, 2], list(range(10))])
    assert not sdar.waiting  # refused before anything was queued
    llada = Engine(tiny_models["llada"], DecodeConfig(gen_length=8, block_length=4), EngineConfig(max_positions=18))
    assert llada.add_request(list(range(10))) == 0
    with pytest.raises(UserError, match=r"request 1 has 11 tokens; .* needs 19 positions but max_positions is 18"):
        llada.add_request(list(range(11)))
    with pytest.raises(ValueError, match="slots"):
        EngineConfig(slots=0)


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_generate_batched_with_an_engine_gives_the_fixed_batch_rollout(tiny_models, family):
    from dllm_rl.sampling import generate_batched

    model = tiny_models[family]
    prompts = _prompts(LENGTHS[:6], seed=5)
    config = DecodeConfig(gen_length=8, block_length=4, temperature=1.0, confidence="random", threshold=0.3, seed=2)
    fixed = generate_batched(model, prompts, config, batch_size=4)
    cont = generate_batched(model, prompts, config, engine=EngineConfig(slots=2))
    for name in ("prompt_ids", "completion_ids", "completion_mask", "step_map", "nfe"):
        assert torch.equal(getattr(cont, name), getattr(fixed, name)), name
    assert len(set(fixed.nfe.tolist())) > 1


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_requests_with_their_own_rules_share_the_steps_and_decode_as_alone(tiny_models, family):
    model = tiny_models[family]
    prompts = _prompts(LENGTHS[:6], seed=6)
    base = DecodeConfig(gen_length=8, block_length=4)
    own = [base, DecodeConfig(gen_length=8, block_length=4, threshold=0.3, temperature=1.0, confidence="random"),
           DecodeConfig(gen_length=8, block_length=4, steps=2, temperature=0.7, top_k=5, top_p=0.9),
           None, DecodeConfig(gen_length=8, block_length=4, steps=1, stop_on_eos=False, seed=40), base]
    engine = Engine(model, base, EngineConfig(slots=6))
    ids = [engine.add_request(p, seed=None if c is not None and c.seed == 40 else 7 + i, config=c)
           for i, (p, c) in enumerate(zip(prompts, own))]
    done, steps = {}, 0
    while engine.has_unfinished():
        done.update({c.request_id: c.rollout for c in engine.step()})
        steps += 1
    for i, (rid, p, c) in enumerate(zip(ids, prompts, own)):
        cfg = c or base
        alone = generate(model, [p], cfg, seeds=[cfg.seed + rid if cfg.seed == 40 else 7 + i])
        assert torch.equal(done[rid].completion_ids, alone.completion_ids), rid
        assert torch.equal(done[rid].step_map, alone.step_map), rid
    # one token a step; the random threshold; 2 steps a block; 1 step a block (sdar: rows rounded to the block)
    assert [int(done[r].nfe) for r in ids] == {"llada": [8, 5, 4, 8, 2, 8], "sdar": [11, 5, 6, 10, 3, 10]}[family]
    assert steps == max(int(done[r].nfe) for r in ids)  # one step served every request at once
    with pytest.raises(ValueError, match=r"block_length: 8 differs from the engine's 4; every request shares"):
        engine.add_request([1], config=DecodeConfig(gen_length=8, block_length=8))


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_a_step_reads_the_device_once_whatever_the_slots(tiny_models, monkeypatch, family):
    """On an accelerator every read of a tensor's value on the host waits for the device; checking, committing or
    starting blocks sequence by sequence would cost that per row and step. The engine decides all its rows in
    batched ops and reads the device once per step, however many slots run."""
    model = tiny_models[family]
    reads = []

    def counted(name):
        original = getattr(torch.Tensor, name)
        return lambda self, *a, **k: reads.append(name) or original(self, *a, **k)

    config = DecodeConfig(gen_length=16, block_length=4, steps=2, temperature=1.0, stop_on_eos=False)

    def reads_per_step(slots):
        engine = Engine(model, config, EngineConfig(slots=slots))
        for p in _prompts([8] * slots, seed=slots):
            engine.add_request(p)
        per_step = []
        with monkeypatch.context() as m:
            for name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero"):
                m.setattr(torch.Tensor, name, counted(name))
            while engine.has_unfinished():
                reads.clear()
                engine.step()
                per_step.append(len(reads))
        return per_step

    two, eight = reads_per_step(2), reads_per_step(8)
    assert len(two) == len(eight) == 8  # 4 blocks of 2 steps; everyone joins at step 1 and finishes at step 8
    # one read per step (the step's finish / next-block flags), the joining step too; the last step builds each
    # finished request's rollout (a few reads per request)
    assert two[:-1] == eight[:-1] == [1] * 7


def test_completions_and_their_settled_prefix(tiny_models):
    model = tiny_models["sdar"]
    config = DecodeConfig(gen_length=8, block_length=4, steps=2, temperature=1.0, stop_on_eos=False)
    engine = Engine(model, config, EngineConfig(slots=2))
    ids = [engine.add_request(p) for p in _prompts([8, 5], seed=9)]
    engine.step()
    got = engine.completions()
    assert sorted(got) == ids
    for seq in engine.running:  # what the slot rows hold for the completion columns, masks where still to do
        tokens, todo = got[seq.request_id]
        c0, c1 = seq.comp
        assert tokens == seq.x[c0:c1].tolist() and todo == seq.todo[c0:c1].tolist()
        assert len(tokens) == c1 - c0 and 0 < todo.count(False) < len(todo)
        assert all(t == model.mask_token_id for t, m in zip(tokens, todo) if m)
    # the settled prefix: committed tokens up to the first masked slot, cut at the first EOS
    assert settled([5, 6, 99, 7], [False, False, True, False], eos=2) == ([5, 6], False)
    assert settled([5, 2, 9, 99], [False, False, False, True], eos=2) == ([5], True)
    assert settled([5, 6, 7], [False, False, False], eos=2) == ([5, 6, 7], False)
    assert settled([99, 6], [True, False], eos=2) == ([], False)


@pytest.mark.parametrize("decoding", [dict(steps=2), dict(temperature=1.0, threshold=0.5),
                                      dict(threshold=0.5, sub_block=2)])
def test_the_shifted_block_family_decodes_as_alone(decoding):
    """Fast-dLLM v2 (a block model whose logits at i score token i + 1): the column before each block is read
    from the fold forward or from the slot's stored copy; prompts shorter than a block start at column 0."""
    kw = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    model = build_model("fast_dllm_v2", tiny_config("fast_dllm_v2", block_size=4, **kw), seed=4)
    with torch.no_grad():
        model.model.lm_head.weight.mul_(40.0)  # confidences spread over (0, 1): thresholds bite
    prompts = _prompts([2, 5, 8, 3, 6, 1, 9], seed=6)
    config = DecodeConfig(gen_length=8, **decoding)
    model = _with_frequent_eos(model, prompts, config)
    seeds = [50 + i for i in range(len(prompts))]
    ids, done, _ = _serve(Engine(model, config, EngineConfig(slots=3)), prompts, [8, 12, 4, 8, 12, 8, 4], seeds)
    for rid, p, g, s in zip(ids, prompts, [8, 12, 4, 8, 12, 8, 4], seeds):
        one = generate(model, [p], DecodeConfig(**{**vars(config), "gen_length": g}), seeds=[s])
        assert torch.equal(done[rid].completion_ids, one.completion_ids), rid
        assert torch.equal(done[rid].step_map, one.step_map) and torch.equal(done[rid].nfe, one.nfe), rid
    assert len({int(done[i].nfe) for i in ids}) > 2 and any(done[i].finish_reason == ["eos"] for i in ids)


@pytest.mark.parametrize("family", ["sdar", "llada", "fast_dllm_v2"])
def test_prefilled_tokens_decode_as_generate_puts_them(tiny_models, family):
    """Prefilled completion tokens (IGPO's hints, inpainting): committed before decoding with step_map -1; a block
    they fill entirely costs no step, and one they fill with EOS alone ends the answer there (EOS stop); a request
    they fill entirely finishes without a slot."""
    kw = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    model = tiny_models.get(family) or build_model(family, tiny_config(family, block_size=4, **kw), seed=2)
    eos = model.eos_token_id
    prompts = _prompts([5, 8, 3, 4, 6, 4], seed=8)  # lengths 8 and 4: no prompt tail in a block model's first block
    prefill = [{0: 7, 5: 9},  # two hints
               {0: 7, 1: 8, 2: 9, 3: 10, 4: 11, 5: 12, 6: 13, 7: 14},  # the whole completion (8 of 8 slots)
               {},
               {4: eos, 5: eos, 6: eos, 7: eos},  # the second block, EOS alone: the answer ends after the first
               {2: 5},
               {0: 1, 1: 2, 2: 3, 3: 4}]  # the first block: decoding starts at the second
    config = DecodeConfig(gen_length=8, block_length=4, temperature=1.0, threshold=0.5, seed=3)
    fixed = generate_batched(model, prompts, config, prefill=prefill)
    cont = Engine(model, config, EngineConfig(slots=2)).run(prompts, prefill=prefill)
    for name in ("completion_ids", "completion_mask", "step_map", "nfe", "prefilled"):
        assert torch.equal(getattr(cont, name), getattr(fixed, name)), name
    assert cont.finish_reason == fixed.finish_reason
    assert cont.nfe[1] == 0 and bool((cont.step_map[1] == -1).all())  # nothing to decode
    assert cont.finish_reason[3] == "eos" and bool((cont.step_map[3, 4:] == -1).all())
    assert bool((cont.step_map[5, :4] == -1).all()) and bool((cont.step_map[5, 4:] >= 0).any())
    assert bool(cont.prefilled[0, [0, 5]].all()) and int(cont.prefilled[0].sum()) == 2
    with pytest.raises(UserError, match="request 0: prefill: offset 8 is outside the 8 completion slots"):
        Engine(model, config).add_request([1, 2, 3, 4], prefill={8: 3})
    # partial decodes (d-TreeRPO's tree nodes): a request ends before its until_block-th decoded block, the rest of
    # its completion masked; with the prefills (a node continues its parent), as generate_batched leaves them
    until = [1, 2, 0, 1, 2, 1]  # 0: nothing decoded; the last: its first block prefilled, so it decodes nothing
    fixed = generate_batched(model, prompts, config, prefill=prefill, until_block=until)
    cont = Engine(model, config, EngineConfig(slots=2)).run(prompts, prefill=prefill, until_block=until)
    for name in ("completion_ids", "completion_mask", "step_map", "nfe", "prefilled"):
        assert torch.equal(getattr(cont, name), getattr(fixed, name)), name
    assert cont.nfe.tolist()[2] == 0 and cont.nfe.tolist()[5] == 0 and bool((cont.step_map[0, 4:] == -1).all())
    assert bool((cont.completion_ids[0, [4, 6, 7]] == model.mask_token_id).all())  # left masked (5: prefilled)
    early = Engine(model, config, EngineConfig(slots=2, early_stop=True)).run(prompts, prefill=prefill,
                                                                              until_block=until)
    assert torch.equal(early.completion_ids, fixed.completion_ids)  # early stop leaves a partial decode's rest masked
