"""Presets follow their papers, the demo configs keep their (tuned) behaviour, every method has a recipe, and every
list of the methods (the table of docs/methods.md, help) is derived from the methods' modules."""

from __future__ import annotations

import subprocess
import sys
from operator import attrgetter
from pathlib import Path

import pytest

from dllm_rl.config import load_config
from dllm_rl.rl.algorithms import resolve
from dllm_rl.rl.cli import demo_config_path
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.losses import POLICY_LOSSES
from dllm_rl.rl.method import Method, Preset
from dllm_rl.rl.methods import METHODS
from dllm_rl.rl.presets import PRESETS, TABLE_HEADER, methods_table

REPO = Path(__file__).resolve().parents[2]

# The resolved demo configs before the presets moved to paper defaults (beta 0.01 for espo / tracerl).
DEMO_PINS = {
    "full": dict(algorithm="tracerl", estimator="trace", estimator_options={"shrinkage": 8}, loss_type="token",
                 loss_aggregation="token_mean", beta=0.0, kl_estimator="k3", advantage="group_zscore",
                 scale_rewards="group", estimator_noise="sample", epsilon=0.2, rollout_hook=None,
                 loss_options=None,
                 **{"train.max_steps": 400, "train.prompts_per_step": 16, "rollout.num_generations": 8, "run.seed": 0}),
    "block": dict(algorithm="espo", estimator="elbo", estimator_options={"coupled": True, "num_mc": 2},
                  loss_type="sequence", loss_aggregation="seq_mean", beta=0.0, kl_estimator="k2",
                  advantage="leave_one_out", scale_rewards="none", estimator_noise="group", epsilon=0.2,
                  rollout_hook=None, loss_options=None,
                  **{"train.max_steps": 200, "train.prompts_per_step": 16, "rollout.num_generations": 8,
                     "run.seed": 0}),
}


@pytest.mark.parametrize("kind", ["full", "block"])
def test_demo_configs_resolve_as_before(kind):
    cfg = resolve(load_config(RLConfig, demo_config_path(kind), ["model.path=m"]), kind)
    assert {k: attrgetter(k)(cfg) for k in DEMO_PINS[kind]} == DEMO_PINS[kind]
    assert cfg.optim.lr == 1e-4
    assert (cfg.rollout.gen_length, cfg.rollout.block_length) == ((16, 16) if kind == "full" else (32, 4))


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_a_presets_kl_is_one_its_loss_applies(algorithm):
    """Each preset's KL (its paper's, stated in its module) is what resolving it gives, and its loss has a level to
    apply it at when beta > 0."""
    preset = METHODS[algorithm].preset
    cfg = resolve(load_config(RLConfig, None, ["model.path=m", f"algorithm={algorithm}"]), "full")
    assert (cfg.beta, cfg.kl_estimator) == (preset.beta, preset.kl_estimator)
    assert preset.beta == 0 or POLICY_LOSSES[preset.loss_type].kl_level is not None


def test_a_preset_holds_the_clip_range():
    """DAPO's clip-higher is a preset's epsilon_high, not a new loss; what a user sets wins."""
    import dllm_rl.rl.algorithms as algorithms

    dapo = Preset(**{**METHODS["diffu_grpo"].preset.fields(), "epsilon_high": 0.28})
    presets = {**PRESETS, "diffu_grpo": dapo.fields()}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(algorithms, "PRESETS", presets)
        cfg = resolve(load_config(RLConfig, None, ["model.path=m", "algorithm=diffu_grpo"]), "full")
        assert (cfg.epsilon, cfg.epsilon_high, cfg.loss_type) == (0.2, 0.28, "token")
        mine = resolve(load_config(RLConfig, None, ["model.path=m", "algorithm=diffu_grpo", "epsilon_high=0.3"]),
                       "full")
        assert mine.epsilon_high == 0.3
    assert resolve(load_config(RLConfig, None, ["model.path=m", "algorithm=diffu_grpo"]), "full").epsilon_high is None


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_every_preset_has_a_recipe_that_loads_without_its_model(algorithm):
    path = REPO / "configs" / METHODS[algorithm].recipe
    cfg = load_config(RLConfig, path)  # the model named there is not here: loading must not need it
    assert cfg.algorithm == algorithm
    assert not Path(cfg.model.path).exists()
    out = resolve(cfg, "block" if algorithm == "tracerl" else "full")
    assert out.estimator == PRESETS[algorithm]["estimator"]


def test_spg_block_length_follows_the_rollout_block():
    cfg = resolve(load_config(RLConfig, REPO / "configs" / METHODS["spg"].recipe), "full")
    assert cfg.estimator_options == {"num_mc": 2, "block_length": 32}
    recipe = REPO / "configs" / METHODS["spg"].recipe
    assert resolve(load_config(RLConfig, recipe), "block").estimator_options == {"num_mc": 2}


def test_help_config_prints_the_preset_table():
    out = subprocess.run([sys.executable, "-m", "dllm_rl", "rl", "--help-config"], capture_output=True, text=True,
                         check=True).stdout
    table = out[out.index("presets (algorithm=NAME"):]
    lines = [ln for ln in table.splitlines()[1:] if ln.strip()]
    assert [ln.split()[0] for ln in lines] == list(PRESETS)
    assert "  spg (SPG, arXiv 2510.09541): estimator=spg_block{'num_mc': 2}, loss=spg, loss_options={'mode': " \
           "'mix', 'eubo_beta': 1.5, 'mix_weight': 0.5}" in table
    assert "hook=igpo" in table


def test_unknown_hook_option_is_a_config_error():
    from dllm_rl.config import ConfigError

    cfg = load_config(RLConfig, None, ["model.path=m", "algorithm=igpo", "rollout_hook_options={chunk: 3}"])
    with pytest.raises(ConfigError, match="rollout_hook_options: chunk not options of 'igpo'; valid: column, "):
        resolve(cfg, "full")


def test_the_methods_table_is_the_derived_one():
    """docs/methods.md shows the table make docs writes (scripts/make_docs.py); the README points to it."""
    text = (REPO / "docs" / "methods.md").read_text()
    start = text.index(TABLE_HEADER[0])
    shown = text[start:text.index("\n<!-- end of preset table -->", start)].splitlines()
    assert shown == methods_table()
    assert [row.split("`")[1] for row in shown[2:]] == sorted(METHODS)
    assert all(row.count("|") == len(TABLE_HEADER[1].split("|")) - 1 for row in shown)  # no cell splits a row
    assert TABLE_HEADER[0] not in (REPO / "README.md").read_text()


def test_help_clauses_are_derived_from_the_presets():
    from dllm_rl.rl.presets import preset_clause

    assert preset_clause("kl_estimator") == "Preset: k2 for bgpo, espo, mdpo; k3 otherwise"
    assert preset_clause("advantage").startswith("Preset: leave_one_out for d_treerpo, espo; ")
    assert preset_clause("epsilon_high") == "Preset: none for every preset"


def test_a_method_is_one_module(tmp_path, monkeypatch):
    """A new module in rl/methods declaring METHOD is a method: nothing else lists the methods."""
    import dllm_rl.rl.methods as methods

    (tmp_path / "toy_grpo.py").write_text(
        "from dllm_rl.rl.method import Method, Preset\n"
        "METHOD = Method(name='toy_grpo', paper='Toy, arXiv 0000.00000', recipe='toy.yaml', preset=Preset(\n"
        "    estimator='mean_field', estimator_options={}, loss_type='token', loss_aggregation='token_mean',\n"
        "    beta=0.0, kl_estimator='k3', advantage='group_zscore', scale_rewards='group',\n"
        "    estimator_noise='sample'))\n")
    monkeypatch.setattr(methods, "__path__", [*methods.__path__, str(tmp_path)])
    found = methods._discover()
    assert list(found) == sorted([*METHODS, "toy_grpo"])
    assert found["toy_grpo"].preset.loss_type == "token"
    (tmp_path / "toy_grpo.py").write_text("X = 1\n")
    monkeypatch.delitem(sys.modules, "dllm_rl.rl.methods.toy_grpo")
    with pytest.raises(TypeError, match="must declare METHOD = Method"):
        methods._discover()


def test_a_method_whose_words_would_split_the_table_is_refused():
    preset = METHODS["espo"].preset
    with pytest.raises(ValueError, match="cannot hold '\\|'"):
        Method(name="x", paper="X, arXiv 1", preset=preset, recipe="x.yaml", notes={"loss": "top-K by |A|"})


def test_a_preset_is_typed():
    """A preset is a Preset: a dict, or one with an unknown or missing field, is refused when it is declared."""
    fields = METHODS["espo"].preset.fields()
    with pytest.raises(TypeError, match="preset is a Preset"):
        Method(name="x", paper="X, arXiv 1", preset=fields, recipe="x.yaml")
    with pytest.raises(TypeError, match="unexpected keyword argument 'clip'"):
        Preset(**fields, clip=0.3)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'advantage'"):
        Preset(**{k: v for k, v in fields.items() if k != "advantage"})


def test_the_cli_help_lists_every_preset(capsys):
    from dllm_rl.cli import main
    from dllm_rl.rl.cli import preset_names

    assert preset_names().split(" | ") == list(PRESETS)
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert [name for name in PRESETS if name not in shown] == []
