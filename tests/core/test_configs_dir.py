"""Every YAML shipped in configs/ and the demo folder loads into its config class (no stale keys, no deprecated
spelling)."""

import re
from pathlib import Path

import pytest

from dllm_rl.config import load_config
from dllm_rl.config.renames import DeprecatedKey
from dllm_rl.dpo.config import DPOConfig
from dllm_rl.dpo.pairs import PairsConfig
from dllm_rl.eval.config import EvalRunConfig
from dllm_rl.rl.algorithms import resolve
from dllm_rl.rl.config import RLConfig
from dllm_rl.sft.config import SFTConfig

REPO = Path(__file__).resolve().parents[2]
YAMLS = sorted((REPO / "configs").glob("*.yaml")) + sorted((REPO / "src/dllm_rl/assets/demo").glob("*.yaml"))


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_shipped_config_loads(path, recwarn):
    _load(path)
    assert [str(w.message) for w in recwarn if issubclass(w.category, DeprecatedKey)] == []  # no old key or value


def _load(path):
    if "sft" in path.name:
        load_config(SFTConfig, path)
    elif path.name.startswith("eval-"):
        assert load_config(EvalRunConfig, path).resolved().model.path
    elif re.search(r"(^|-)(dpo|vrpo)[-.]", path.name):  # not mdpo (an RL preset)
        load_config(DPOConfig, path)
    elif path.name.endswith("-pairs.yaml"):
        assert load_config(PairsConfig, path).decode.temperature == 1
    else:
        cfg = load_config(RLConfig, path)
        resolve(cfg, "block" if any(k in path.name for k in ("trado", "block", "llada2", "sdar")) else "full")


def test_there_are_recipes_for_both_founding_methods():
    names = {p.name for p in YAMLS}
    assert {"llada-espo-gsm8k.yaml", "trado-tracerl-math.yaml", "rl-full.yaml", "rl-block.yaml"} <= names
