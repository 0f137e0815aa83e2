"""Uniform-state families (DiffusionGemma) through the front door: ``generate`` routes them to the uniform sampler, the
Rollout carries the trajectory, the config refuses the other kind's options; ``dllm-rl generate`` / ``eval`` /
``trace`` on a tiny checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from dllm_rl.cli import main
from dllm_rl.errors import UserError
from dllm_rl.models import build_model, char_tokenizer, save_model, tiny_config
from dllm_rl.sampling import DecodeConfig, Rollout, generate, generate_batched
from dllm_rl.sampling.engine import EngineConfig
from dllm_rl.sampling.inputs import uniform_decode_config
from dllm_rl.sampling.presets import preset
from dllm_rl.sampling.uniform import UniformDecodeConfig, sample_uniform
from dllm_rl.sampling.uniform_rollout import UniformTrace, uniform_step_map
from dllm_rl.sampling.uniform_trace import replay_logits, trajectory_logprob

CANVAS, EOS, PAD = 8, 1, 0
TOK = char_tokenizer("abcdefgh ")  # pad 0, eos 1 (Gemma's), mask 2, unk 3, then 9 characters: 13 ids
PROMPTS = [[4, 5, 6, 7, 8], [9, 10], [5, 5, 11]]


def _model(scale: float = 1.0):
    cfg = tiny_config("diffusion_gemma", vocab_size=16, hidden_size=32, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=CANVAS, max_position_embeddings=128)
    dlm = build_model("diffusion_gemma", cfg, seed=0)
    with torch.no_grad():  # sharper logits: rows stop early and EOS appears
        dlm.hf_model.model.decoder.embed_tokens.weight.mul_(scale)
    return dlm


@pytest.fixture(scope="module")
def dlm():
    return _model()


@pytest.fixture(scope="module")
def sharp():
    return _model(20.0)


DECODE = DecodeConfig(gen_length=2 * CANVAS, max_denoising_steps=4, seed=3)


def _alone(model, prompt: list[int], seed: int, cfg: DecodeConfig = DECODE):
    return sample_uniform(model, torch.tensor([prompt]), uniform_decode_config(cfg),
                          generator=torch.Generator().manual_seed(seed), eos_token_id=EOS, pad_token_id=PAD)


def _padded(ids: torch.Tensor, width: int) -> list[int]:
    """A row that finished early (fewer canvases) padded to ``width``, as a batch holds it."""
    return ids.tolist() + [PAD] * (width - ids.shape[-1])


def test_generate_routes_a_uniform_family_and_each_row_is_the_stock_sampler_alone(dlm):
    """Every row draws from its own generator: its tokens are those it gets alone (the sampler's direct output under
    its seed), and the stock ``generate`` under the same seed."""
    roll = generate(dlm, PROMPTS, DECODE)
    assert roll.completion_ids.shape == (3, 2 * CANVAS) and roll.uniform is not None
    for i, p in enumerate(PROMPTS):
        alone = _alone(dlm, p, 3 + i)
        assert roll.completion_ids[i].tolist() == _padded(alone.completion_ids[0], 2 * CANVAS)
        assert int(roll.nfe[i]) == int(alone.forward_passes[0])
        torch.manual_seed(3 + i)
        stock = dlm.hf_model.generate(torch.tensor([p]), max_new_tokens=2 * CANVAS, max_denoising_steps=4,
                                      eos_token_id=EOS, pad_token_id=PAD)
        assert _padded(stock.sequences[0, len(p):], 2 * CANVAS) == roll.completion_ids[i].tolist()
    # rows 0 and 2 end with EOS in their first canvas (4 passes), row 1 in its second
    assert roll.nfe.tolist() == [4, 8, 4] and roll.finish_reason == ["eos", "eos", "eos"]
    assert roll.completion_mask.sum(1).tolist() == [3, 9, 3]
    assert roll.completion_ids[0, 2] == EOS and (roll.completion_ids[0, 3:] == PAD).all()


def test_a_row_that_stops_early_draws_in_a_batch_what_it_draws_alone(sharp):
    """A row stopped (adaptive stopping) while others still denoise its canvas draws no more numbers, as alone, where
    its canvas ends there: so its next canvas starts from the same random ids, and every row equals itself alone."""
    cfg = DecodeConfig(gen_length=3 * CANVAS, max_denoising_steps=6, confidence_threshold=0.5, stability_threshold=0,
                       seed=1)
    prompts = [*PROMPTS, [6, 7], [12, 4, 4, 4]]
    roll = generate(sharp, prompts, cfg)
    for i, p in enumerate(prompts):
        alone = generate(sharp, [p], cfg, seeds=[1 + i])
        assert roll.completion_ids[i].tolist() == alone.completion_ids[0].tolist()
        assert int(roll.nfe[i]) == int(alone.nfe[0])
    # (before, row 1 went on drawing while the batch denoised its first canvas: 12 passes in the batch, 7 alone)
    assert roll.nfe.tolist() == [5, 7, 3, 1, 4]


def test_the_rollout_carries_the_samplers_record(sharp):
    """Step s of the trajectory is the sampler's step s, in its canvas's columns; the step map is the counted step
    that last accepted the kept token; stopped rows are not counted."""
    cfg = DecodeConfig(gen_length=2 * CANVAS, max_denoising_steps=6, confidence_threshold=0.5, stability_threshold=0,
                       seed=1)
    roll = generate(sharp, PROMPTS, cfg)
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    record = sample_uniform(sharp, roll.prompt_ids, uniform_decode_config(cfg), attention_mask=roll.prompt_mask,
                            generator=gens, eos_token_id=EOS, pad_token_id=PAD)
    tr = roll.uniform
    assert tr.canvas.shape == tr.sampled.shape == tr.accepted.shape == (3, len(record.steps), 2 * CANVAS)
    assert tr.canvas.dtype == torch.int32 and tr.counted.shape == (3, len(record.steps))
    for s, st in enumerate(record.steps):
        cols = slice(st.canvas_index * CANVAS, (st.canvas_index + 1) * CANVAS)
        other = slice((1 - st.canvas_index) * CANVAS, (2 - st.canvas_index) * CANVAS)
        assert torch.equal(tr.accepted[:, s, cols], st.accepted) and not tr.accepted[:, s, other].any()
        assert torch.equal(tr.canvas[:, s, cols].long(), st.canvas) and (tr.canvas[:, s, other] == PAD).all()
        assert torch.equal(tr.sampled[:, s, cols].long(), st.sampled)
        assert torch.equal(tr.counted[:, s], st.active)
        assert bool(tr.self_conditioned[0, s]) == st.self_conditioned and int(tr.step[1, s]) == st.step
    assert tr.counted.sum(1).tolist() == roll.nfe.tolist() == record.forward_passes.tolist()
    # rows stop at different steps (fewer passes than 6 a canvas); row 2 ends in its first canvas (EOS)
    assert roll.nfe.tolist() == [5, 7, 3] and roll.finish_reason == ["eos", "eos", "eos"]
    assert bool(tr.stopped[1].any()) and tr.done[2, 4:].all() and not tr.done[:2].any()
    # step_map by hand: the last counted step accepting a draw equal to the kept token
    index = tr.counted.long().cumsum(1) - 1
    for b in range(3):
        for j in range(2 * CANVAS):
            hits = [int(index[b, s]) for s in range(len(record.steps)) if tr.counted[b, s] and tr.accepted[b, s, j]
                    and int(tr.sampled[b, s, j]) == int(roll.completion_ids[b, j])]
            want = hits[-1] if hits and roll.completion_mask[b, j] else -1
            assert int(roll.step_map[b, j]) == want
    assert (roll.step_map >= 0).sum() > 0 and (roll.step_map < roll.nfe[:, None]).all()
    # the record rebuilt from the rollout replays to the same trajectory log-probability
    ucfg = uniform_decode_config(cfg)
    again = sample_uniform(sharp, roll.prompt_ids, UniformDecodeConfig(**{**ucfg.__dict__, "keep_logits": True}),
                           attention_mask=roll.prompt_mask,
                           generator=[torch.Generator().manual_seed(s) for s in (1, 2, 3)], eos_token_id=EOS,
                           pad_token_id=PAD)
    again.steps = tr.record()
    assert torch.equal(trajectory_logprob(again.steps, replay_logits(sharp, again, ucfg)),
                       trajectory_logprob(record.steps, replay_logits(sharp, record, ucfg)))


def test_sampled_final_tokens_keep_each_rows_last_draws_and_count_every_position(sharp):
    """final_tokens="sampled": each canvas keeps the ids its row's last counted step drew, that step accepts every
    position (so every kept token has its step in step_map), and the random numbers are the stock ones: the canvases
    fed in are those of the argmax rule until a canvas ends; each row is still itself alone."""
    stock = DecodeConfig(gen_length=2 * CANVAS, max_denoising_steps=6, confidence_threshold=0.5, stability_threshold=0,
                         seed=1)
    cfg = DecodeConfig(**{**stock.__dict__, "final_tokens": "sampled"})
    roll, argmax = generate(sharp, PROMPTS, cfg), generate(sharp, PROMPTS, stock)
    tr = roll.uniform
    index = tr.counted_index()
    for b in range(3):
        for c in range(2):
            steps = [s for s in range(tr.step.shape[1]) if tr.counted[b, s] and int(tr.canvas_index[b, s]) == c]
            if not steps:
                continue
            cols, last = slice(c * CANVAS, (c + 1) * CANVAS), steps[-1]
            kept = roll.completion_ids[b, cols]
            drawn = tr.sampled[b, last, cols].long()
            held = roll.completion_mask[b, cols]  # (after the first EOS the kept canvas is pad)
            assert torch.equal(kept[held], drawn[held]) and bool(tr.accepted[b, last, cols].all())
            assert (roll.step_map[b, cols][held] == int(index[b, last])).all()
    assert (roll.step_map[roll.completion_mask] >= 0).all()
    # the first canvas: the same random ids, canvases and passes as the argmax rule
    first, stock_first = tr.canvas_index[0] == 0, argmax.uniform.canvas_index[0] == 0
    assert torch.equal(tr.canvas[:, first][..., :CANVAS], argmax.uniform.canvas[:, stock_first][..., :CANVAS])
    assert torch.equal(tr.counted[:, first], argmax.uniform.counted[:, stock_first])
    assert roll.completion_ids[:, :CANVAS].tolist() != argmax.completion_ids[:, :CANVAS].tolist()
    for i, p in enumerate(PROMPTS):
        alone = generate(sharp, [p], cfg, seeds=[1 + i])
        assert roll.completion_ids[i].tolist() == _padded(alone.completion_ids[0], 2 * CANVAS)[:2 * CANVAS]


def test_confidence_threshold_zero_turns_adaptive_stopping_off(sharp):
    """The sharp model's rows stop early at 0.5 (fewer than 6 passes a canvas); at 0 every row takes all 6 steps of
    every canvas it decodes."""
    stopping = DecodeConfig(gen_length=2 * CANVAS, max_denoising_steps=6, confidence_threshold=0.5,
                            stability_threshold=0, seed=1)
    never = DecodeConfig(**{**stopping.__dict__, "confidence_threshold": 0.0})
    early, full = generate(sharp, PROMPTS, stopping), generate(sharp, PROMPTS, never)
    canvases = full.uniform.counted.new_zeros(3).long()
    for b in range(3):
        canvases[b] = len({int(c) for c, n in zip(full.uniform.canvas_index[b], full.uniform.counted[b], strict=True)
                           if n})
    assert full.nfe.tolist() == (6 * canvases).tolist()
    assert (early.nfe < full.nfe).any()


def test_step_map_on_a_hand_checkable_trace():
    """One canvas of 4, two counted steps then one uncounted: position 0 kept the draw of step 1, position 1 that of
    step 0 (step 1 drew something else there), position 2 never accepted its kept token, position 3's only hit is
    in the uncounted step."""
    trace = UniformTrace(
        canvas_length=4, canvas_index=torch.zeros(1, 3, dtype=torch.long), step=torch.tensor([[3, 2, 1]]),
        self_conditioned=torch.tensor([[False, True, True]]), stopped=torch.tensor([[False, False, True]]),
        done=torch.zeros(1, 3, dtype=torch.bool),
        canvas=torch.zeros(1, 3, 4, dtype=torch.int32),
        sampled=torch.tensor([[[5, 6, 7, 8], [5, 9, 7, 1], [5, 6, 7, 8]]], dtype=torch.int32),
        accepted=torch.tensor([[[True, True, False, False], [True, True, False, False], [True, True, True, True]]]))
    assert uniform_step_map(trace, torch.tensor([[5, 6, 7, 8]])).tolist() == [[1, 0, -1, -1]]
    assert trace.counted_index().tolist() == [[0, 1, -1]]


def test_select_and_cat_keep_the_trajectory(dlm):
    a = generate(dlm, PROMPTS[:2], DECODE)
    b = generate(dlm, PROMPTS[2:], DecodeConfig(gen_length=CANVAS, max_denoising_steps=2, seed=5))
    both = Rollout.cat([a, b])
    assert both.uniform.canvas.shape == (3, 8, 2 * CANVAS)
    assert torch.equal(both.select([2]).uniform.accepted[0, :2, :CANVAS], b.uniform.accepted[0])
    assert not both.uniform.counted[2, 2:].any() and (both.uniform.canvas_index[2, 2:] == -1).all()
    assert torch.equal(both.select([1, 0]).uniform.sampled, a.uniform.sampled.flip(0))
    assert torch.equal(generate_batched(dlm, PROMPTS, DECODE, batch_size=2).completion_ids,
                       generate(dlm, PROMPTS, DECODE).completion_ids)  # batch invariance
    with pytest.raises(ValueError, match="do not mix"):
        Rollout.cat([a, Rollout(a.prompt_ids, a.prompt_mask, a.completion_ids, a.completion_mask, a.step_map, a.nfe,
                                a.finish_reason)])


@pytest.mark.parametrize(("kw", "fragment"), [
    ({"steps": 4}, "steps=4 is a masked-diffusion option"),
    ({"threshold": 0.9}, "threshold=0.9 is a masked-diffusion option"),
    ({"temperature": 0.7}, "temperature=0.7 is a masked-diffusion option"),
    ({"cache": "prefix"}, "cache='prefix' is a masked-diffusion option"),
    ({"remasking": "rcr", "steps": 2}, "steps=2 is a masked-diffusion option"),
    ({"block_length": 8}, "block_length=8 is a masked-diffusion option"),
    ({"gen_length": 12}, "gen_length (12) must be a multiple of the model's canvas_length (8)"),
    ({"gen_length": 128}, "with gen_length 128 it needs 133 positions but the model's context is 128"),
    ({"t_max": 0.3}, "t_max: must be above t_min (0.4)"),
])
def test_a_uniform_family_refuses_mask_options_naming_the_key(dlm, kw, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        generate(dlm, PROMPTS, DecodeConfig(**{"gen_length": CANVAS, **kw}))


def test_a_canvas_beyond_the_models_positions_is_refused_and_the_engine_decodes_as_generate(dlm):
    cfg = tiny_config("diffusion_gemma", vocab_size=16, hidden_size=32, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=64, max_position_embeddings=32)
    with pytest.raises(UserError, match=r"canvas_length \(64, the model's config.json\) exceeds .* 32 positions"):
        generate(build_model("diffusion_gemma", cfg, seed=0), [[4]], DecodeConfig(gen_length=64))
    by_engine = generate_batched(dlm, PROMPTS, DECODE, engine=EngineConfig(slots=2))
    assert torch.equal(by_engine.completion_ids, generate(dlm, PROMPTS, DECODE).completion_ids)
    with pytest.raises(UserError, match="prefill is not supported for diffusion_gemma"):
        generate(dlm, PROMPTS[:1], DECODE, prefill=[{0: 4}])


def test_a_masked_family_refuses_uniform_options():
    cfg = tiny_config("llada", vocab_size=16, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32)
    with pytest.raises(UserError, match="entropy_bound=0.2 is a uniform-state diffusion option .* llada is masked"):
        generate(build_model("llada", cfg, seed=0), [[4]], DecodeConfig(gen_length=32, entropy_bound=0.2))


def test_the_diffusion_gemma_preset_is_the_stock_generation_config():
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    stock = DiffusionGemmaGenerationConfig._get_default_generation_params()
    values = preset("diffusion_gemma")
    cfg = uniform_decode_config(DecodeConfig(**values))
    assert values["gen_length"] == stock["max_new_tokens"] == 256
    for key in ("max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold"):
        assert getattr(cfg, key) == stock[key] == values[key]
    assert cfg.entropy_bound == stock["sampler_config"].entropy_bound == 0.1


# -- the command line ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, dlm):
    path = tmp_path_factory.mktemp("dg")
    save_model(dlm, path, tokenizer=TOK)
    (path / "qa.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n"
                                           for q, a in (("ab", "#### 3"), ("ba", "#### 4"), ("hh", "#### 5"))))
    return path


def test_generate_cli_prints_the_samplers_tokens_and_the_trace_draws_the_canvases(ckpt, tmp_path, capsys, dlm):
    trace = tmp_path / "t.jsonl"
    rc = main(["generate", str(ckpt), "--prompt", "abc", "--prompt", "hh", "--gen-length", "16",
               "--max-denoising-steps", "3", "--seed", "7", "--trace", str(trace)])
    assert rc == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    for i, text in enumerate(("abc", "hh")):
        ids = TOK.encode(text)
        alone = _alone(dlm, ids, 7 + i, DecodeConfig(gen_length=16, max_denoising_steps=3))
        assert rows[i]["token_ids"] == _padded(alone.completion_ids[0], 16)
        assert rows[i]["nfe"] == int(alone.forward_passes[0])
        kept = [t for t in alone.completion_ids[0].tolist() if t not in (EOS, PAD)]
        assert rows[i]["completion"] == TOK.decode(kept[:rows[i]["answer_length"]], skip_special_tokens=True)
        assert rows[i]["completion"] in out
        steps = rows[i]["uniform_steps"]
        assert [(s["step"], s["canvas"]) for s in steps] == [(k, k // 3) for k in range(len(alone.steps))]
        assert [s["accepted"] for s in steps] == [st.accepted[0].nonzero().flatten().tolist() for st in alone.steps]
        assert rows[i]["block_length"] == CANVAS and len(rows[i]["steps"]) == 16
    html = tmp_path / "t.html"
    assert main(["trace", "--from-trace", str(trace), "-o", str(html)]) == 0
    page = html.read_text()
    assert page.count('"uniform_steps": [{"step": 0, "canvas": 0') == 2 and "renderUniform" in page


def test_trace_cli_decodes_a_uniform_rollout_into_steps(ckpt, tmp_path):
    html = tmp_path / "u.html"
    assert main(["trace", str(ckpt), "--prompt", "ab", "--gen-length", "8", "--max-denoising-steps", "2",
                 "--device", "cpu", "-o", str(html)]) == 0
    page = html.read_text()
    data = json.loads(page.split('<script id="trace-data" type="application/json">')[1].split("</script>")[0])
    rec = data["records"][0]
    assert rec["num_steps"] == 3 and rec["block_length"] == CANVAS and rec["block_offset"] == 0
    assert [s["step"] for s in rec["uniform_steps"]] == [0, 1]
    assert all(len(s["tokens"]) == CANVAS and set(s["accepted"]) <= set(range(CANVAS)) for s in rec["uniform_steps"])


def test_eval_cli_reports_accuracy_and_nfe(ckpt, tmp_path):
    out = tmp_path / "ev"
    assert main(["eval", str(ckpt), "--task", str(ckpt / "qa.jsonl"), "--task-type", "gsm8k", "-o", str(out),
                 "--no-progress", "--gen-length", "8", "--max-denoising-steps", "3", "--prompt-style", "plain"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    metrics = summary["settings"]["default"]["metrics"]
    assert metrics["accuracy"] == 0.0 and metrics["nfe_mean"] == 3.0
    assert summary["settings"]["default"]["decode"]["max_denoising_steps"] == 3


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--steps", "4"], "steps=4 is a masked-diffusion option; diffusion_gemma is uniform-state diffusion"),
    (["--gen-length", "12"], "gen_length (12) must be a multiple of the model's canvas_length (8)"),
])
def test_generate_cli_refusals_are_one_line_with_status_2(ckpt, capsys, argv, fragment):
    assert main(["generate", str(ckpt), "--prompt", "ab", "--gen-length", "8", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dllm-rl generate: error: ") and fragment in err[0]
