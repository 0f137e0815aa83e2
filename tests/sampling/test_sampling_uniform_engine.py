"""The continuous-batching engine on a uniform-state family (DiffusionGemma): each request gets exactly what
``generate`` gives it alone under its seed (tokens, step counts, trajectory), whoever shares its steps and whenever
it arrives; per-request knobs; log-probabilities at the step that kept a token; refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_rl.errors import UserError
from dllm_rl.models import build_model, tiny_config
from dllm_rl.sampling import DecodeConfig, generate
from dllm_rl.sampling.engine import Engine, EngineConfig
from dllm_rl.sampling.inputs import uniform_decode_config
from dllm_rl.sampling.sequence import settled
from dllm_rl.sampling.uniform import UniformRollout
from dllm_rl.sampling.uniform_engine import UniformEngine
from dllm_rl.sampling.uniform_trace import replay_logits

CANVAS, EOS, PAD = 8, 1, 0
# the last prompt is longer than the tiny model's sliding window (8): its sliding layers see part of it
PROMPTS = [[4, 5, 6, 7, 8], [9, 10], [5, 5, 11], [6, 7], [12, 4, 4, 4, 5, 6, 7, 8, 9, 10, 11, 12, 4]]
DECODE = DecodeConfig(gen_length=3 * CANVAS, max_denoising_steps=6, confidence_threshold=0.5, stability_threshold=0,
                      seed=1)


@pytest.fixture(scope="module")
def sharp():
    cfg = tiny_config("diffusion_gemma", vocab_size=16, hidden_size=32, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=CANVAS, max_position_embeddings=128)
    dlm = build_model("diffusion_gemma", cfg, seed=0)
    with torch.no_grad():  # sharper logits: rows stop early and EOS appears
        dlm.hf_model.model.decoder.embed_tokens.weight.mul_(20.0)
    return dlm


def _same(alone, got) -> None:
    for name in ("completion_ids", "completion_mask", "step_map", "nfe"):
        assert torch.equal(getattr(alone, name), getattr(got, name)), name
    assert alone.finish_reason == got.finish_reason
    for name in ("canvas", "sampled", "accepted", "canvas_index", "step", "self_conditioned", "temperature"):
        assert torch.equal(getattr(alone.uniform, name), getattr(got.uniform, name)), name


# request i's own knobs (None: the engine's): another schedule, another stopping rule, no EOS stop
OWN = {2: {"max_denoising_steps": 4, "t_max": 0.9}, 3: {"stop_on_eos": False},
       4: {"stability_threshold": 1, "final_tokens": "sampled"}}


@pytest.mark.parametrize("slots", [2, 4])
def test_each_request_gets_what_generate_gives_it_alone(sharp, slots):
    """Five requests arriving over the first steps, of different lengths and knobs, in 2 or 4 slots: each one's
    tokens, step count, step map and trajectory equal ``generate([prompt], seeds=[seed])``'s."""
    engine = Engine(sharp, DECODE, EngineConfig(slots=slots))
    assert isinstance(engine, UniformEngine)
    arrivals, ids, done, step = {0: [0, 1], 1: [2], 3: [3, 4]}, {}, {}, 0
    configs = {i: dataclasses.replace(DECODE, **OWN.get(i, {})) for i in range(len(PROMPTS))}
    while len(done) < len(PROMPTS):
        for i in arrivals.get(step, []):
            ids[engine.add_request(PROMPTS[i], seed=10 + i, config=configs[i])] = i
        assert sum(s is not None for s in engine.running) <= slots
        for c in engine.step():
            done[ids[c.request_id]] = c.rollout
        step += 1
    for i, prompt in enumerate(PROMPTS):
        _same(generate(sharp, [prompt], configs[i], seeds=[10 + i]), done[i])
    nfe = [int(done[i].nfe[0]) for i in range(len(PROMPTS))]
    reasons = [done[i].finish_reason[0] for i in range(len(PROMPTS))]
    assert nfe == [4, 11, 4, 11, 12] and reasons == ["eos", "length", "eos", "eos", "eos"]
    # requests 0, 2 and 3 hold an EOS in their first canvas: 0 and 2 end there, 3 (no EOS stop) decodes all three
    first_canvas_eos = [bool((done[i].completion_ids[0, :CANVAS] == EOS).any()) for i in range(len(PROMPTS))]
    assert first_canvas_eos == [True, False, True, True, False]
    assert [int(done[i].uniform.canvas_index.max()) for i in range(len(PROMPTS))] == [0, 2, 0, 2, 1]


def test_run_equals_a_fixed_batch(sharp):
    got = Engine(sharp, DECODE, EngineConfig(slots=2)).run(PROMPTS)
    want = generate(sharp, PROMPTS, DECODE)
    for name in ("completion_ids", "completion_mask", "step_map", "nfe"):
        assert torch.equal(getattr(want, name), getattr(got, name)), name
    assert torch.equal(want.uniform.counted.sum(1), got.uniform.counted.sum(1))


def test_logprobs_are_the_kept_canvas_distribution(sharp):
    """A kept token's log-probability is under the tempered softmax of its canvas's last step (whose argmax it is),
    recomputed here from the trajectory; the alternatives come from the same distribution, likeliest first."""
    engine = Engine(sharp, DECODE, EngineConfig(slots=2))
    rid = engine.add_request(PROMPTS[1], seed=5, logprobs=2)
    engine.add_request(PROMPTS[0], seed=6)
    out = {}
    while engine.has_unfinished():
        out.update({c.request_id: c for c in engine.step()})
    roll, lp = out[rid].rollout, out[rid].logprobs
    record = UniformRollout(roll.prompt_ids, roll.prompt_mask, torch.cat([roll.prompt_ids, roll.completion_ids], 1),
                            roll.uniform.record(), roll.nfe)
    replayed = list(replay_logits(sharp, record, uniform_decode_config(DECODE)))
    last = {int(s.canvas_index): i for i, s in enumerate(record.steps)}  # each canvas's last step
    canvases = len(last)
    assert lp.tokens == roll.completion_ids[0, : canvases * CANVAS].tolist()
    for k, i in last.items():
        logp = torch.log_softmax(replayed[i][0].double(), dim=-1)
        for j in range(CANVAS):
            col = k * CANVAS + j
            assert lp.logprobs[col] == pytest.approx(float(logp[j, lp.tokens[col]]), abs=1e-5)  # (kept in float32)
            assert [t for t, _ in lp.top[col]] == torch.topk(logp[j], 2).indices.tolist()
    assert lp.top[0][0][0] == lp.tokens[0]  # the kept token is the argmax


def test_streams_settle_finished_canvases_only(sharp):
    """Between steps a running request's completion reads its finished canvases as settled, its current canvas as
    open: the settled text is the finished canvases' tokens up to EOS."""
    cfg = dataclasses.replace(DECODE, stop_on_eos=False, max_denoising_steps=3, confidence_threshold=1e-9)
    engine = Engine(sharp, cfg, EngineConfig(slots=1))
    rid = engine.add_request(PROMPTS[3], seed=0)
    seen = []
    while engine.has_unfinished():
        progress = engine.completions([rid])
        if progress:
            tokens, todo = progress[rid]
            seq = engine.running[0]
            seen.append((seq.nfe, sum(not t for t in todo), settled(tokens, todo, EOS, seq.final_slots())[0]))
        final = engine.step()
    full = final[0].rollout.completion_ids[0].tolist()
    # a canvas every 3 steps (it never stops early here): after step n, n // 3 canvases are final
    assert [(n, k) for n, k, _ in seen] == [(n, CANVAS * (n // 3)) for n in range(1, 9)]
    for _, k, ids in seen:
        want = full[:k]
        assert ids == (want[: want.index(EOS)] if EOS in want else want)


@pytest.mark.parametrize(("call", "fragment"), [
    (lambda e: e.add_request([4, 5], prefill={0: 4}), "request 0: prefill not served for diffusion_gemma"),
    (lambda e: e.add_request([4, 5], config=dataclasses.replace(DECODE, steps=4)),
     "steps=4 is a masked-diffusion option; diffusion_gemma is uniform-state"),
    (lambda e: e.add_request([4, 5], gen_length=12), "gen_length (12) must be a multiple of the model's canvas_length"),
    (lambda e: e.run([[4, 5]], until_block=[1]), "until_block is not supported for diffusion_gemma"),
])
def test_what_a_uniform_request_cannot_take_is_refused(sharp, call, fragment):
    with pytest.raises(UserError) as err:
        call(Engine(sharp, DECODE, EngineConfig(slots=2)))
    assert fragment in str(err.value)
