"""`dllm-rl demo` (what `make demo` runs) on the shipped checkpoints, cut to one short step."""

import json

import pytest
import yaml

from dllm_rl.cli import main


@pytest.mark.parametrize("model", ["block", "full", "vision", "gemma"])
def test_demo_runs_one_step_and_reports_accuracy_before_and_after(tmp_path, capsys, model):
    ema = ["train.ema_decay=0.9"] if model == "full" else []  # the weight average's line of the report
    rc = main(["demo", "--model", model, "--output-dir", str(tmp_path), "train.max_steps=1", "eval.limit=8",
               "train.prompts_per_step=2", "rollout.num_generations=4", "run.progress=false", "log.samples_every=0",
               *ema])
    assert rc == 0
    out = capsys.readouterr().out
    default = {"block": "espo", "full": "tracerl", "vision": "tracerl", "gemma": "espo"}[model]  # the configs' own
    run = tmp_path / f"{model}-{default}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algorithm"] == default and summary["steps"] == 1
    greedy = "" if model == "gemma" else "greedy "  # the uniform-state sampler has no greedy mode
    report = f"held-out {greedy}accuracy {summary['accuracy_before']:.1%} -> {summary['accuracy_after']:.1%}"
    if ema:
        report += f" (weight average; last live policy {summary['accuracy_after_live']:.1%})"
    assert report + " in " in out
    assert (run / "final" / "model.safetensors").is_file()
    # the demo's held-out set is the shipped file (500 puzzles, 300 shapes questions), limited here to 8 items
    assert "8 held-out" in out
    name = {"block": "block-attention model", "full": "full-attention model", "vision": "LLaDA-V-shaped vision model",
            "gemma": "DiffusionGemma-shaped model"}
    assert f"demo ({default} on the {name[model]}): " in out
    if model == "block":  # the demo ran ESPO's recipe (the step budget of the command line won over its 120)
        saved = yaml.safe_load((run / "config.yaml").read_text())
        assert (saved["advantage"], saved["train"]["ema_every"], saved["train"]["max_steps"]) == ("pass_at_k", 20, 1)
        # run again into the same folder (`make demo` twice): the old run is replaced
        (run / "checkpoints" / "step-0000001").rename(run / "checkpoints" / "step-0000007")
        assert main(["demo", "--model", model, "--output-dir", str(tmp_path), "train.max_steps=1", "eval.limit=8",
                     "train.prompts_per_step=2", "rollout.num_generations=4", "run.progress=false",
                     "log.samples_every=0"]) == 0
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000001"]
        assert json.loads((run / "summary.json").read_text())["start_step"] == 0


def test_the_block_demo_lays_its_espo_recipe_over_the_demo_config_for_espo_only():
    """`make demo` (ESPO on the block model) runs assets/demo/recipes/block-espo.yaml over rl-block.yaml; another
    algorithm, given by flag or override, runs rl-block.yaml as it is; the command line wins over the recipe."""
    from dllm_rl.config import load_config
    from dllm_rl.rl.cli import demo_config_path, demo_overrides, demo_run_overrides, recipe_overrides
    from dllm_rl.rl.config import RLConfig

    def demo(algorithm, *overrides):
        chosen, settings = demo_run_overrides("block", algorithm, list(overrides))
        cfg = load_config(RLConfig, demo_config_path("block"), settings)
        assert cfg.algorithm == chosen
        return cfg

    plain = load_config(RLConfig, demo_config_path("block"), demo_overrides("block"))
    recipe = demo(None)
    assert recipe.algorithm == plain.algorithm == "espo"
    assert (recipe.advantage, recipe.advantage_options, recipe.scale_rewards, recipe.dynamic_sampling) == (
        "pass_at_k", {"k": 4}, "group", True)
    assert (recipe.train.max_steps, recipe.train.max_time_minutes, recipe.train.ema_start, recipe.train.ema_every,
            recipe.train.ema_decay) == (120, 15, 60, 20, 0.9)
    assert (plain.advantage, plain.dynamic_sampling, plain.train.max_steps, plain.train.ema_decay) == (
        None, False, 200, 0)
    assert demo("espo") == recipe and recipe.model == plain.model and recipe.rollout == plain.rollout
    for other in (demo("tracerl"), demo(None, "algorithm=tracerl")):
        assert other.algorithm == "tracerl" and other.train == plain.train and other.advantage is None
    mine = demo(None, "train.ema_start=100", "advantage_options={k: 2}")
    assert mine.train.ema_start == 100 and mine.advantage_options == {"k": 2} and mine.train.ema_every == 20
    assert recipe_overrides("full", "espo") == recipe_overrides("block", "tracerl") == []


@pytest.mark.parametrize(("model", "algorithm"), [("block", "espo"), ("full", "tracerl")])
def test_the_speed_recipe_of_each_text_demo_resolves(model, algorithm):
    """`dllm-rl demo --recipe speed` lays MODEL-ALGORITHM-speed.yaml over the demo config and the algorithm's own
    recipe; the result passes the config's rules (a resolved preset); a recipe the demo lacks is one line naming its
    recipes."""
    from dllm_rl.config import load_config
    from dllm_rl.errors import UserError
    from dllm_rl.rl.algorithms import resolve
    from dllm_rl.rl.cli import demo_config_path, demo_run_overrides
    from dllm_rl.rl.config import RLConfig

    chosen, settings = demo_run_overrides(model, None, [], "speed")
    cfg = load_config(RLConfig, demo_config_path(model), settings)
    assert chosen == cfg.algorithm == algorithm
    assert [(t.kind, t.weight) for t in cfg.reward.terms] == [("task", 1.0), ("speed", 0.5)]
    assert (cfg.reward.normalization, cfg.tpf_spread, cfg.dynamic_sampling, cfg.rollout.threshold) == (
        "decoupled", 0.01, True, 0.9)
    resolve(cfg, "block" if model == "block" else "full")
    if model == "block":  # the ESPO recipe underneath (its weight average), its Pass@4 replaced
        assert cfg.train.ema_decay == 0.9 and cfg.advantage == "group_zscore"
    with pytest.raises(UserError, match=rf"the {model} demo has no 'fast' recipe for {algorithm} .* "
                       rf"{model}-{algorithm}-speed"):
        demo_run_overrides(model, None, [], "fast")


def test_the_gemma_demo_config_resolves_to_cheap_uniform_decoding():
    """rl-gemma.yaml: the shipped DiffusionGemma-shaped checkpoint, one canvas of 16 decoded in 8 denoising steps
    without adaptive stopping (the stock 48 would make CPU rollouts 6x dearer), rollouts keeping their draws and the
    held-out evaluation the argmax; a step and a time budget; ESPO with its recipe, TraceRL's trajectory when asked."""
    from dllm_rl.config import load_config
    from dllm_rl.models import load_model
    from dllm_rl.rl.algorithms import resolve
    from dllm_rl.rl.cli import demo_config_path, demo_run_overrides
    from dllm_rl.rl.config import RLConfig, decode_config

    chosen, settings = demo_run_overrides("gemma", None, [])
    cfg = load_config(RLConfig, demo_config_path("gemma"), settings)
    model = load_model(cfg.model.path)
    assert chosen == cfg.algorithm == "espo" and model.family.noise == "uniform"
    assert (cfg.train.max_steps, cfg.train.max_time_minutes, cfg.eval.limit) == (250, 12, 500)
    for evaluation, kept in ((False, "sampled"), (True, "argmax")):
        decode = decode_config(cfg, model, evaluation=evaluation)
        assert (decode.gen_length, decode.max_denoising_steps, model.layout_block()) == (16, 8, 16)
        assert (decode.confidence_threshold, decode.final_tokens) == (0, kept)
    # ESPO's recipe (recipes/gemma-espo.yaml): online RAFT over the published SFT objective
    espo = resolve(cfg, "block", model.family)
    assert (espo.estimator, espo.advantage) == ("uniform_denoise", "raft")
    assert (cfg.train.ema_start, cfg.train.ema_every, cfg.train.ema_decay) == (150, 25, 0.9)  # steps 175-250's mean
    tracerl = load_config(RLConfig, demo_config_path("gemma"), demo_run_overrides("gemma", "tracerl", [])[1])
    assert resolve(tracerl, "block", model.family).estimator == "trajectory"
