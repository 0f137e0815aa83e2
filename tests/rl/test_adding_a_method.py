"""Adding a method touches one new module and one recipe, nothing else: in a copy of the repository, a DAPO
clip-higher GRPO (a preset with a clip range, no new loss) and its recipe are added, ``make docs`` writes the
generated docs, and that method's tests (its preset, recipe and KL, the generated docs, the preset x family matrix
on LLaDA, the refusal on DiffusionGemma) pass there with no other edit."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE = "src/dllm_rl/rl/methods/dapo_grpo.py"
RECIPE = "configs/llada-dapo-grpo-gsm8k.yaml"
DAPO = '''"""DAPO's clip-higher GRPO (arXiv 2503.14476): d1's mean-field estimate with the upper clip raised to 0.28."""

from dllm_rl.rl.method import Method, Preset

METHOD = Method(
    name="dapo_grpo", paper="DAPO, arXiv 2503.14476", recipe="llada-dapo-grpo-gsm8k.yaml",
    preset=Preset(estimator="mean_field", estimator_options={"p_mask_prompt": 0.15}, loss_type="token",
                  loss_aggregation="token_mean", beta=0.0, kl_estimator="k3", advantage="group_zscore",
                  scale_rewards="group", estimator_noise="sample", epsilon=0.2, epsilon_high=0.28),
    notes={"loss": "clip-higher"},
)
'''
DAPO_RECIPE = """# DAPO clip-higher GRPO on LLaDA-8B-Instruct, GSM8K
model:
  path: checkpoints/LLaDA-8B-Instruct
data:
  task: gsm8k
algorithm: dapo_grpo
rollout:
  gen_length: 256
  block_length: 32
"""
#: the method's tests, in the copy: its own parameters, the generated docs and every list of the methods
TESTS = ["tests/rl/test_rl_presets.py::test_a_presets_kl_is_one_its_loss_applies[dapo_grpo]",
         "tests/rl/test_rl_presets.py::test_every_preset_has_a_recipe_that_loads_without_its_model[dapo_grpo]",
         "tests/rl/test_rl_presets.py::test_the_methods_table_is_the_derived_one",
         "tests/rl/test_rl_presets.py::test_the_cli_help_lists_every_preset",
         "tests/rl/test_rl_presets.py::test_a_method_is_one_module",
         "tests/rl/test_rl_methods_matrix.py::test_preset_runs_two_steps_on_every_family[dapo_grpo-llada]",
         "tests/rl/test_rl_methods_matrix.py::test_preset_runs_or_is_refused_on_diffusion_gemma[dapo_grpo]",
         "tests/core/test_config_renames.py::test_the_generated_docs_are_current"]

def _digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.is_symlink() and "assets" not in p.parts}


@pytest.mark.slow  # about 30 s: a pytest run in the copy that builds tiny models and trains
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_new_method_is_one_module_and_one_recipe(tmp_path):
    copy = tmp_path / "repo"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "assets", "*.egg-info")
    for name in ("src", "configs", "docs", "scripts", "tests"):
        shutil.copytree(REPO / name, copy / name, ignore=skip)
    for name in ("Makefile", "README.md", "pyproject.toml"):
        shutil.copy2(REPO / name, copy / name)
    (copy / "src/dllm_rl/assets").symlink_to(REPO / "src/dllm_rl/assets")  # data only; nothing here writes there
    before = _digests(copy)
    (copy / MODULE).write_text(DAPO)
    (copy / RECIPE).write_text(DAPO_RECIPE)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    make = subprocess.run(["make", "-o", "install", "docs", f"PY={sys.executable}"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=300)
    assert make.returncode == 0, make.stderr
    after = _digests(copy)
    changed = sorted(k for k in after if before.get(k) != after[k])
    assert changed == sorted([MODULE, RECIPE, "docs/config.md", "docs/methods.md"])
    row = next(line for line in (copy / "docs/methods.md").read_text().splitlines() if line.startswith("| `dapo"))
    assert row == ("| `dapo_grpo` | DAPO, arXiv 2503.14476 | `mean_field` {p_mask_prompt: 0.15} | `token`, token_mean, "
                   "clip 0.2/0.28 (clip-higher) | 0 | `group_zscore` / group | - | `llada-dapo-grpo-gsm8k.yaml` |")

    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *TESTS],
                           cwd=copy, env={**env, "PYTHONPATH": str(copy / "src")},
                           capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    summary = tests.stdout.strip().splitlines()[-1]
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert summary.startswith(f"{len(TESTS)} passed"), summary
