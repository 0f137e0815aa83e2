"""The engine on real tiny models: LLaDA reference equality, exact block cache, batch invariance."""

import pytest
import torch

from dllm_rl.sampling import DecodeConfig, Rollout, generate, generate_batched

LENGTHS = [1, 3, 5, 6, 9, 2, 7, 4]  # several prompt lengths that are not multiples of the block size


def _prompts(lengths, vocab=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def llada_reference(model, prompt, steps, gen_length, block_length, temperature=0.0, generator=None,
                    remasking="low_confidence"):
    """The published LLaDA `generate` (batch 1, no CFG), with `steps` per block and this engine's noise
    convention (one float64 draw of [block, vocab] per step from `generator`)."""
    mask_id = model.mask_token_id
    plen = len(prompt)
    x = torch.full((1, plen + gen_length), mask_id, dtype=torch.long)
    x[0, :plen] = torch.tensor(prompt)
    steps_taken = torch.full((gen_length,), -1)
    step = 0
    for b in range(gen_length // block_length):
        s, e = plen + b * block_length, plen + (b + 1) * block_length
        m = int((x[0, s:e] == mask_id).sum())
        counts = [m // steps + (i < m % steps) for i in range(steps)]
        for k in counts:
            if k == 0:
                continue
            mask_index = x == mask_id
            logits = model(x).logits.double()
            x0 = logits.argmax(-1)
            if temperature > 0:
                u = torch.rand((block_length, logits.shape[-1]), generator=generator, dtype=torch.float64)
                x0[:, s:e] = (logits[:, s:e].exp() / (-torch.log(u)) ** temperature).argmax(-1)
            if remasking == "random":
                x0_p = torch.full(x0.shape, -torch.inf, dtype=torch.float64)
                x0_p[0, s:e] = torch.rand(block_length, generator=generator, dtype=torch.float64)
            else:
                x0_p = torch.softmax(logits, -1).gather(-1, x0[..., None]).squeeze(-1)
            x0_p[:, e:] = -torch.inf
            conf = torch.where(mask_index, x0_p, -torch.inf)
            idx = torch.topk(conf[0], k).indices
            x[0, idx] = x0[0, idx]
            steps_taken[idx - plen] = step
            step += 1
    return x[0, plen:], steps_taken


@pytest.mark.parametrize("steps, gen, block, temp, remask", [
    (3, 16, 8, 0.0, "low_confidence"), (8, 16, 8, 0.0, "low_confidence"), (2, 12, 4, 0.0, "low_confidence"),
    (4, 16, 8, 0.9, "low_confidence"), (3, 8, 8, 0.0, "random"),
])
def test_static_greedy_reproduces_llada_generate(tiny_models, steps, gen, block, temp, remask):
    model = tiny_models["llada"]
    conf = "random" if remask == "random" else "prob"
    for prompt in _prompts([5, 11], seed=steps):
        ref, ref_steps = llada_reference(model, prompt, steps, gen, block, temp, torch.Generator().manual_seed(4),
                                         remask)
        r = generate(model, [prompt], DecodeConfig(gen_length=gen, block_length=block, steps=steps, temperature=temp,
                                                   confidence=conf, stop_on_eos=False), seeds=[4])
        assert r.completion_ids[0].tolist() == ref.tolist()
        assert r.step_map[0].tolist() == ref_steps.tolist()


@pytest.mark.parametrize("cfg", [dict(), dict(steps=2), dict(threshold=0.6), dict(temperature=1.0, top_p=0.9)])
def test_block_model_cache_equals_no_cache(sharp_sdar, cfg):
    model = sharp_sdar
    config = DecodeConfig(gen_length=12, stop_on_eos=False, **cfg)
    prompts = _prompts(LENGTHS)
    batch = generate(model, prompts, config)
    batch_ref = generate(model, prompts, config, block_cache=False)
    assert torch.equal(batch.completion_ids, batch_ref.completion_ids)
    assert torch.equal(batch.step_map, batch_ref.step_map)
    assert torch.equal(batch.nfe, batch_ref.nfe)
    for i in (0, 3, 4):  # batch 1
        one = generate(model, [prompts[i]], config, seeds=[i])
        one_ref = generate(model, [prompts[i]], config, seeds=[i], block_cache=False)
        assert torch.equal(one.completion_ids, one_ref.completion_ids)
        assert torch.equal(one.step_map, one_ref.step_map)
        n = one.completion_ids.shape[1]
        assert torch.equal(one.completion_ids[0], batch.completion_ids[i, :n])
    # completion lengths follow SDAR's rounding: 12 + (4 - p % 4) % 4
    assert (batch.step_map >= 0).sum(-1).tolist() == [12 + (4 - n % 4) % 4 for n in LENGTHS]
    if "threshold" in cfg:
        assert batch.nfe.float().mean() < 11  # the threshold commits several tokens per step


def _same_rows(batch: Rollout, singles: list[Rollout]):
    for i, one in enumerate(singles):
        n = one.completion_ids.shape[1]
        assert torch.equal(one.completion_ids[0], batch.completion_ids[i, :n]), i
        assert torch.equal(one.step_map[0], batch.step_map[i, :n]), i
        assert torch.equal(one.nfe, batch.nfe[i : i + 1]), i
        assert one.finish_reason[0] == batch.finish_reason[i]


@pytest.mark.parametrize("family, cache", [("llada", "none"), ("llada", "dual"), ("dream", "prefix"),
                                           ("sdar", "none")])
@pytest.mark.parametrize("sampled", [False, True])
def test_batch_invariance(tiny_models, family, cache, sampled):
    model = tiny_models[family]
    extra = dict(temperature=0.8, top_k=20, top_p=0.95) if sampled else {}
    config = DecodeConfig(gen_length=8, block_length=4, cache=cache, steps=2, **extra)
    prompts = _prompts(LENGTHS, seed=1)
    seeds = [100 + i for i in range(len(prompts))]
    batch = generate(model, prompts, config, seeds=seeds)
    _same_rows(batch, [generate(model, [p], config, seeds=[s]) for p, s in zip(prompts, seeds)])


def test_fast_dllm_caches_are_exact_with_one_step_per_block(tiny_models):
    # Every step of a one-step block is a cache refresh (a full forward), so prefix/dual equal no cache.
    prompts = _prompts([4, 7, 2], seed=2)
    for family in ("llada", "dream"):
        base = DecodeConfig(gen_length=12, block_length=4, steps=1, stop_on_eos=False)
        ref = generate(tiny_models[family], prompts, base)
        for cache in ("prefix", "dual"):
            out = generate(tiny_models[family], prompts, DecodeConfig(**{**vars(base), "cache": cache}))
            assert torch.equal(out.completion_ids, ref.completion_ids)


def test_generate_batched_matches_one_batch(tiny_models):
    model = tiny_models["sdar"]
    prompts = _prompts(LENGTHS[:7], seed=3)
    config = DecodeConfig(gen_length=8, temperature=1.0, seed=11)
    whole = generate(model, prompts, config)
    parts = generate_batched(model, prompts, config, batch_size=3)
    assert len(parts) == 7 and parts.completion_ids.shape == whole.completion_ids.shape
    assert torch.equal(parts.completion_ids, whole.completion_ids)
    assert torch.equal(parts.step_map, whole.step_map)
    assert torch.equal(parts.prompt_ids, whole.prompt_ids)


def _with_eos(model, eos: int):
    from dllm_rl.models import DiffusionLM

    return DiffusionLM(model.model, model.family, {**model.published_config, "eos_token_id": eos})


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_eos_stops_rows_independently(tiny_models, sharp_sdar, family):
    model = sharp_sdar if family == "sdar" else tiny_models[family]
    prompts = _prompts(LENGTHS, seed=5)
    config = DecodeConfig(gen_length=16, block_length=4, stop_on_eos=False)
    free = generate(model, prompts, config)
    # Make the most frequent generated token the EOS, so some rows stop early and leave the batch.
    gen = free.completion_ids[free.step_map >= 0]
    model = _with_eos(model, int(torch.bincount(gen).argmax()))
    config = DecodeConfig(gen_length=16, block_length=4)
    batch = generate(model, prompts, config)
    never = (batch.step_map == -1) & batch.completion_ids.ne(model.pad_token_id)
    stopped = never.any(-1)
    assert stopped.any() and len(set(batch.nfe.tolist())) > 1  # rows stopped early, at different blocks
    assert all(batch.finish_reason[i] == "eos" for i in stopped.nonzero().flatten().tolist())
    assert (batch.completion_ids[never] == model.eos_token_id).all()
    assert (batch.nfe < free.nfe).any() and (batch.step_map.max(-1).values + 1 == batch.nfe).all()
    _same_rows(batch, [generate(model, [p], config, seeds=[i]) for i, p in enumerate(prompts)])
    if family == "sdar":
        ref = generate(model, prompts, config, block_cache=False)
        assert torch.equal(ref.completion_ids, batch.completion_ids) and torch.equal(ref.step_map, batch.step_map)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_step_map_replays_the_decoding_states(tiny_models, family):
    """TraceRL's replay: the state before step k (tokens with 0 <= step < k, the rest masked) reproduces the
    logits the sampler used, so step k's tokens are the argmax there and the recorded confidence is p(token)."""
    model = tiny_models[family]
    prompts = _prompts([3, 6, 5], seed=6)
    r = generate(model, prompts, DecodeConfig(gen_length=8, block_length=4, steps=2, stop_on_eos=False))
    for i, prompt in enumerate(prompts):
        n = int((r.step_map[i] >= 0).sum())
        comp, steps = r.completion_ids[i, :n], r.step_map[i, :n]
        for k in range(int(r.nfe[i])):
            state = torch.where((steps >= 0) & (steps < k), comp, torch.full_like(comp, model.mask_token_id))
            x = torch.cat([torch.tensor(prompt), state])[None]
            probs = model(x).logits[0, len(prompt):].double().softmax(-1)
            at_k = steps == k
            assert at_k.any()
            assert torch.equal(probs.argmax(-1)[at_k], comp[at_k]), (i, k)
            got = r.confidence[i, :n][at_k].double()
            assert torch.allclose(got, probs.max(-1).values[at_k], atol=1e-5), (i, k)


@pytest.mark.parametrize("family, cache", [("llada", "none"), ("dream", "prefix"), ("sdar", "none")])
def test_a_partial_state_continued_from_its_prefill_is_the_one_decode(tiny_models, family, cache):
    # until_block stops each row after its first blocks (the rest masked); continuing from that state (its tokens
    # prefilled) decodes the rest exactly as the one decode did, in the same steps: the tree rollouts' continuation
    model = tiny_models[family]
    config = DecodeConfig(gen_length=12, block_length=4, cache=cache, steps=2, stop_on_eos=False)
    prompts = _prompts([3, 6, 5], seed=4)
    full = generate(model, prompts, config)
    part = generate(model, prompts, config, until_block=[1, 2, 0])
    for i, blocks in enumerate([1, 2, 0]):
        done = part.step_map[i] >= 0
        assert int(done.sum()) == [4, 8, 0][i] - (len(prompts[i]) % 4 if family == "sdar" and blocks else 0)
        assert torch.equal(part.completion_ids[i][done], full.completion_ids[i][done])
        assert torch.equal(part.step_map[i][done], full.step_map[i][done])
        assert (part.completion_ids[i][~done & (full.step_map[i] >= 0)] == model.mask_token_id).all()
    prefill = [{j: int(part.completion_ids[i, j]) for j in (part.step_map[i] >= 0).nonzero().flatten().tolist()}
               for i in range(len(prompts))]
    rest = generate(model, prompts, config, prefill=prefill)
    assert torch.equal(rest.completion_ids, full.completion_ids)
    assert torch.equal(rest.nfe + part.nfe, full.nfe)
    resumed = rest.step_map >= 0
    assert torch.equal(rest.step_map[resumed], (full.step_map - part.nfe[:, None])[resumed])


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_tree_rollouts_are_batch_invariant(tiny_models, family):
    # a prompt's tree (its nodes' tokens and steps) is the same grown with other prompts' trees or alone
    from dllm_rl.rl.tree import TreeShape, grow_tree

    model = tiny_models[family]
    config = DecodeConfig(gen_length=8, block_length=4, steps=2, temperature=1.0)
    prompts = _prompts([3, 6, 5], seed=5)
    shape = TreeShape(2, 2, 2)

    def tree(which: list[int]):
        def decode(idx, prefill, until):
            owners = [which[i // shape.samples] for i in idx]
            seeds = [1000 * p + i % shape.samples for p, i in zip(owners, idx)]
            return generate(model, [prompts[p] for p in owners], config, seeds=seeds, prefill=prefill,
                            until_block=until)
        tail = [len(prompts[p]) % 4 if family == "sdar" else 0 for p in which]
        blocks = [-(-(t + 8) // 4) for t in tail]
        return grow_tree(decode, shape, blocks, [4 * b - t for b, t in zip(blocks, tail)], model.mask_token_id)

    together = tree([0, 1, 2])
    for p in range(3):
        alone = tree([p])
        rows = list(range(p * shape.samples, (p + 1) * shape.samples))
        n = alone.nodes.completion_ids.shape[1]
        assert torch.equal(alone.nodes.completion_ids, together.nodes.completion_ids[rows, :n])
        assert torch.equal(alone.nodes.step_map, together.nodes.step_map[rows, :n])


def test_a_tree_node_that_stopped_on_eos_passes_its_filled_state_on(fakes):
    # block 0 decodes to EOS only: the row stops and EOS fills block 1 (step_map -1 from the sampler). The tree
    # counts the fill as the node's own, at its last step, so its children inherit it and decode nothing.
    from dllm_rl.rl.tree import TreeShape, grow_tree

    eos = fakes.EOS
    model = fakes.fake_model(fakes.table_from({2: (eos, 0.9), 3: (eos, 0.89), 4: (eos, 0.88), 5: (eos, 0.87)}))
    config = DecodeConfig(gen_length=8, block_length=4, steps=2)

    def decode(idx, prefill, until):
        return generate(model, [[1, 2]] * len(idx), config, prefill=prefill, until_block=until)

    tree = grow_tree(decode, TreeShape(1, 2, 2), [2], [8], fakes.MASK)
    assert tree.nodes.completion_ids.eq(eos).all() and tree.committed.all()
    assert tree.nodes.step_map.tolist() == [[0, 0, 1, 1, 1, 1, 1, 1], [-1] * 8, [-1] * 8]
    assert tree.nodes.nfe.tolist() == [2, 0, 0]


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_fast_dllm_caches_are_the_full_forward_with_the_refresh_keys_outside_the_fresh_columns(family, cache):
    """The approximation itself, against an oracle that shares no cache code: each step's prediction equals a full
    forward of the current canvas in which every layer's keys and values outside the fresh columns (the block, and
    for the prefix cache everything after it) are those of the block's refresh forward (Fast-dLLM, arXiv
    2505.22618: keys computed once per block and reused). Dream's first block column is scored by the column
    before it, whose query the cached steps never run again: it keeps the refresh forward's prediction."""
    from dllm_rl.models import build_model, tiny_config

    kw = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    model = build_model(family, tiny_config(family, **kw), seed=3)
    with torch.no_grad():  # attention that depends on its context, and confidences that spread
        for name, weight in model.model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                weight.mul_(4.0)
        model.model.lm_head.weight.mul_(20.0)
    prompt, gen, block = [5, 2, 8], 8, 4
    config = DecodeConfig(gen_length=gen, block_length=block, steps=block, cache=cache, stop_on_eos=False)
    out = generate(model, [prompt], config, record_steps="greedy")
    p, shifted = len(prompt), family == "dream"
    if shifted:  # the first block's first column is decoded at a cached step, from the refresh's prediction
        assert out.step_map[0, 0] > 0
    projections = [m for n, m in model.model.named_modules() if n.endswith(("k_proj", "v_proj"))]
    refresh, stale = {}, []

    def hook(module, args, output):
        if stale:  # the oracle forward: the refresh's keys / values outside the fresh columns
            return torch.where(stale[0][None, :, None], refresh[module], output)
        refresh[module] = output.detach().clone()
        return None

    handles = [m.register_forward_hook(hook) for m in projections]
    try:
        for t in range(out.nfe.item()):
            j = t // block  # the block this step decodes (one token per step, nothing skipped)
            s, e = p + j * block, p + (j + 1) * block
            state = torch.tensor(prompt + [model.mask_token_id] * gen)
            committed = out.step_map[0] < t
            state[p:][committed] = out.completion_ids[0][committed]
            with torch.no_grad():
                if t % block == 0:  # the refresh: the whole canvas, as without a cache
                    stale.clear()
                    first = model(state[None]).logits[0, s].float()
                cols = torch.arange(p + gen)
                stale.append(~((cols >= s) & (cols < e)) if cache == "dual" else cols < s)
                logits = model(state[None]).logits[0, s:e].float()
                stale.clear()
            if shifted:
                logits[0] = first
            probs = logits.softmax(-1)
            masked = out.step_masked[0, t, j * block:(j + 1) * block]
            assert masked.any()
            got = out.step_tokens[0, t, j * block:(j + 1) * block].long()
            assert torch.equal(got[masked], probs.argmax(-1)[masked]), t
            conf = out.step_confidence[0, t, j * block:(j + 1) * block]
            assert torch.allclose(conf[masked], probs.max(-1).values[masked], atol=1e-5), t
    finally:
        for h in handles:
            h.remove()
    # an approximation: the predictions of the cached steps differ from the exact decoding's
    exact = generate(model, [prompt], DecodeConfig(**{**vars(config), "cache": "none"}), record_steps="greedy")
    assert (exact.step_confidence - out.step_confidence).abs().max() > 0.01
