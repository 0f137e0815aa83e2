"""``dllm-rl eval MODEL_DIR --demo``: the shipped demo checkpoints evaluated as ``make demo`` reports them."""

from __future__ import annotations

import json

import pytest

from dllm_rl.cli import main
from dllm_rl.eval.demo import DEMO_DIR, HELDOUT, decode_lengths, demo_defaults
from dllm_rl.jsonl import read_jsonl
from dllm_rl.models import save_model
from dllm_rl.sft.config import ModelConfig
from dllm_rl.sft.model_build import build_tokenizer_and_model


def _eval(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["eval", *argv, "--no-run.progress"])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("name", ["llada-countdown", "sdar-countdown"])
def test_shipped_checkpoint_solves_some_heldout_puzzles(name, tmp_path, capsys):
    rc, out, _ = _eval(capsys, str(DEMO_DIR / name), "--demo", "--limit", "40", "--batch-size", "40",
                       "-o", str(tmp_path), "--json")
    assert rc == 0
    summary = json.loads(out)
    m = summary["settings"]["default"]["metrics"]
    assert summary["task"] == "countdown" and m["samples"] == 40
    assert m["accuracy"] >= 0.1  # greedy: llada 14/40, sdar 7/40
    records = read_jsonl(tmp_path / "items" / "default.jsonl")
    assert all(r["completion"].startswith("<answer>") for r in records[:5])
    assert all(r["prompt"].startswith("nums ") for r in records)  # compact prompts


def test_demo_decodes_each_demo_model_as_its_rl_config_does():
    assert decode_lengths(DEMO_DIR / "llada-countdown") == (16, 16)
    assert decode_lengths(DEMO_DIR / "sdar-countdown") == (32, 4)
    assert decode_lengths(DEMO_DIR / "elsewhere") == (32, 32)
    # the vision demo's checkpoint is evaluated on its own task and held-out file (rl-vision.yaml)
    assert demo_defaults(DEMO_DIR / "llada_v-shapes", {}) == {
        "task": "shapes", "data": str(DEMO_DIR / "shapes_heldout.jsonl"), "prompt_style": "compact",
        "decode": {"gen_length": 16, "block_length": 16}}
    assert demo_defaults(DEMO_DIR / "sdar-countdown", {}) == {
        "task": "countdown", "data": str(HELDOUT), "prompt_style": "compact",
        "decode": {"gen_length": 32, "block_length": 4}}
    # block_length follows an explicit gen_length; an explicit block_length wins
    assert demo_defaults(DEMO_DIR / "llada-countdown", {"gen_length": 8})["decode"] == {"gen_length": 8,
                                                                                        "block_length": 8}
    assert demo_defaults(DEMO_DIR / "llada-countdown", {"block_length": 4})["decode"] == {"gen_length": 16,
                                                                                          "block_length": 4}


def test_demo_decodes_the_uniform_state_demo_with_its_rl_configs_sampler_knobs(tmp_path, capsys):
    """gemma-countdown (DiffusionGemma-shaped): one canvas of 16 and rl-gemma.yaml's 8 denoising steps, no block
    length (its config names none, and the uniform sampler refuses one); an explicit flag wins."""
    assert decode_lengths(DEMO_DIR / "gemma-countdown") == (16, None)
    knobs = {"confidence_threshold": 0, "final_tokens": "argmax"}  # no adaptive stopping; the evaluation's argmax
    assert demo_defaults(DEMO_DIR / "gemma-countdown", {})["decode"] == {"gen_length": 16, "max_denoising_steps": 8,
                                                                         **knobs}
    assert demo_defaults(DEMO_DIR / "gemma-countdown", {"max_denoising_steps": 4})["decode"] == {
        "gen_length": 16, "max_denoising_steps": 4, **knobs}
    rc, out, _ = _eval(capsys, str(DEMO_DIR / "gemma-countdown"), "--demo", "--limit", "8", "-o", str(tmp_path),
                       "--json")
    m = json.loads(out)["settings"]["default"]["metrics"]
    assert rc == 0 and m["samples"] == 8 and m["nfe_mean"] == 8
    assert all(r["completion"].startswith("<answer>") for r in read_jsonl(tmp_path / "items" / "default.jsonl"))


def test_demo_decodes_another_uniform_state_checkpoint_as_its_familys_demo(tmp_path):
    """A DiffusionGemma checkpoint that is not the shipped one (a `make demo MODEL=gemma` run's final model) decodes
    as rl-gemma.yaml does: no block_length (it was "one block of 32", which the uniform sampler refuses), the demo's
    canvas and denoising steps; an explicit gen_length wins."""
    import shutil

    shutil.copy(DEMO_DIR / "gemma-countdown" / "config.json", tmp_path / "config.json")
    assert decode_lengths(tmp_path) == (16, None)
    knobs = {"max_denoising_steps": 8, "confidence_threshold": 0, "final_tokens": "argmax"}
    assert demo_defaults(tmp_path, {})["decode"] == {"gen_length": 16, **knobs}
    assert demo_defaults(tmp_path, {"gen_length": 32})["decode"] == {"gen_length": 32, **knobs}
    assert decode_lengths(DEMO_DIR / "llada-countdown" / "elsewhere") == (32, 32)


def test_demo_decodes_at_the_held_out_evaluations_temperatures(monkeypatch):
    """A uniform-state demo config whose rollouts explore hotter than its evaluation: --demo decodes as the RL run's
    held-out evaluation (eval.t_max / eval.t_min), not as its rollouts."""
    import dllm_rl.eval.demo as demo

    config = {"model": {"path": "gemma-countdown"}, "data": {"task": "countdown", "prompt_style": "compact"},
              "eval": {"data": "countdown_heldout.jsonl", "t_max": 0.8, "t_min": 0.4},
              "rollout": {"gen_length": 16, "max_denoising_steps": 8, "t_max": 1.2, "t_min": 0.8}}
    monkeypatch.setattr(demo, "demo_config", lambda model_dir: config)
    assert demo_defaults(DEMO_DIR / "gemma-countdown", {})["decode"] == {
        "gen_length": 16, "max_denoising_steps": 8, "t_max": 0.8, "t_min": 0.4}


def test_demo_on_a_fresh_model_and_its_errors(tmp_path, capsys):
    tok, dlm = build_tokenizer_and_model(ModelConfig(tokenizer="char", hidden_size=32, num_layers=1,
                                                     intermediate_size=32, num_heads=2, num_kv_heads=2))
    save_model(dlm, tmp_path / "m", tokenizer=tok)
    rc, out, _ = _eval(capsys, str(tmp_path / "m"), "--demo", "--limit", "3", "--decode.gen-length", "8", "-o",
                       str(tmp_path / "out"), "--json", "--threads", "1")
    assert rc == 0
    summary = json.loads(out)
    setting = summary["settings"]["default"]
    assert setting["metrics"]["accuracy"] == 0.0 and setting["metrics"]["samples"] == 3
    assert (setting["decode"]["gen_length"], setting["decode"]["block_length"], setting["decode"]["steps"],
            setting["decode"]["temperature"]) == (8, 8, None, 0.0)
    assert summary["meta"]["prompt_style"] == "compact" and summary["meta"]["data"]["items"] == 500
    rc, _, err = _eval(capsys, str(tmp_path / "nope"), "--demo", "-o", str(tmp_path / "o2"))
    assert rc == 2 and err == f"dllm-rl eval: error: model directory {tmp_path / 'nope'} does not exist\n"
    (tmp_path / "empty.jsonl").write_text("")
    rc, _, err = _eval(capsys, str(tmp_path / "m"), "--demo", "--data", str(tmp_path / "empty.jsonl"), "-o",
                       str(tmp_path / "o3"))
    assert rc == 2 and err == (f"dllm-rl eval: error: {tmp_path / 'empty.jsonl'}: no items to evaluate "
                               "(task 'countdown'); give a file with at least one item\n")
    rc, _, err = _eval(capsys, str(tmp_path / "m"), "-o", str(tmp_path / "o4"))
    assert rc == 2 and err == ("dllm-rl eval: error: give the task with --task NAME (or a data file), or --demo "
                               "for a shipped demo checkpoint\n")


def test_demo_decodes_a_block_model_at_another_block_size(tmp_path, capsys):
    """--block-size 8 decodes the block-4 demo model in blocks of 8 (other NFE: rows end on a block-8 boundary),
    records it in the metadata and leaves the model's own block as it was; full-attention models refuse it."""
    from dllm_rl.config.vocabulary import ModelSection
    from dllm_rl.eval.harness import EvalRunConfig, run_eval
    from dllm_rl.models import load_model
    from dllm_rl.sampling import DecodeConfig
    from dllm_rl.training.run_config import RunConfig

    model = load_model(DEMO_DIR / "sdar-countdown")
    nfe = {}
    for block in (8, None):
        cfg = EvalRunConfig(model=ModelSection(path=str(DEMO_DIR / "sdar-countdown")), task="countdown",
                            data=str(HELDOUT), limit=4, prompt_style="compact",
                            decode=DecodeConfig(gen_length=32, block_length=4, block_size=block),
                            run=RunConfig(output_dir=str(tmp_path / f"b{block}"), progress=False))
        summary = run_eval(cfg, model=model, log=lambda msg: None)
        nfe[block] = summary["settings"]["default"]["metrics"]["nfe_mean"]
        assert model.block_size == 4
    assert nfe[8] != nfe[None]
    assert json.loads((tmp_path / "b8" / "meta.json").read_text())["block_size"] == 8
    assert "block_size" not in json.loads((tmp_path / "bNone" / "meta.json").read_text())
    rc, _, err = _eval(capsys, str(DEMO_DIR / "sdar-countdown"), "--demo", "--decode.block-size", "8", "--limit", "2",
                       "-o", str(tmp_path / "cli"), "--json")
    assert rc == 0 and json.loads(_)["meta"]["block_size"] == 8
    rc, _, err = _eval(capsys, str(DEMO_DIR / "llada-countdown"), "--demo", "--decode.block-size", "8", "-o",
                       str(tmp_path / "full"))
    assert rc == 2 and "decode.block_size: for block models (SDAR/TraDo) only" in err



GEMMA_SETTINGS = {
    "thresholds": (["--thresholds", "0.5"], "thresholds: the curve varies the masked samplers' confidence threshold; "
                   "diffusion_gemma is uniform-state diffusion: compare its own with --setting "
                   "NAME:confidence_threshold=X"),
    "tokens_per_step": (["--setting", "s1:tokens_per_step=1"], "setting 's1': tokens_per_step sets a masked static "
                        "schedule; diffusion_gemma is uniform-state diffusion: set max_denoising_steps instead"),
    "block_cache": (["--setting", "s1:block_cache=false"], "setting 's1': block_cache=false is for masked block "
                    "models; diffusion_gemma decodes whole canvases from random ids: drop it"),
    "t_max": (["--setting", "a:final_tokens=sampled", "--setting", "b:t_max=0.1"],
              "setting 'b': t_max: must be above t_min (0.4)"),
    "threshold": (["--setting", "dyn:threshold=0.9"], "setting 'dyn': threshold=0.9 is a masked-diffusion option; "
                  "diffusion_gemma is uniform-state diffusion (no mask token)"),
}


@pytest.mark.parametrize("case", sorted(GEMMA_SETTINGS))
def test_masked_schedules_on_the_gemma_demo_are_refused_naming_what_was_given(case, tmp_path, capsys, monkeypatch):
    """--thresholds, tokens_per_step and block_cache on a uniform-state model are refused by the names the user gave,
    and a setting's bad key names the setting, all before the model loads (before: "threshold=1.0" or "steps=256",
    values the user never wrote, or a t_max error naming no setting, after loading the model)."""
    import dllm_rl.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    args, problem = GEMMA_SETTINGS[case]
    rc, _, err = _eval(capsys, str(DEMO_DIR / "gemma-countdown"), f"task={HELDOUT}", "task_type=countdown",
                       "prompt_style=compact", "limit=2", "decode.gen_length=16", "-o", str(tmp_path), *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"dllm-rl eval: error: {problem}"), lines[0]


def test_a_uniform_state_key_on_a_masked_demo_names_the_setting(tmp_path, capsys):
    rc, _, err = _eval(capsys, str(DEMO_DIR / "sdar-countdown"), f"task={HELDOUT}", "task_type=countdown",
                       "prompt_style=compact", "limit=2", "decode.gen_length=16", "-o", str(tmp_path),
                       "--setting", "a:final_tokens=sampled")
    assert rc == 2
    assert err.strip() == ("dllm-rl eval: error: setting 'a': final_tokens='sampled' is a uniform-state diffusion "
                           "option (DiffusionGemma); sdar is masked diffusion: drop final_tokens")
