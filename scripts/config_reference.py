"""Print the configuration reference of every command (``docs/config.md``, which ``make docs`` writes:
``scripts/make_docs.py``)::

    python scripts/config_reference.py > docs/config.md

``tests/core/test_config_renames.py`` checks that the file equals this output."""

from __future__ import annotations

from typing import Any


def command_configs() -> list[tuple[str, type, Any]]:
    """``(title, config class, default instance or None)`` of every command's configuration."""
    from dllm_rl.dpo.config import DPOConfig
    from dllm_rl.dpo.pairs import PairsConfig
    from dllm_rl.eval.config import EvalRunConfig, PlotConfig, TraceConfig
    from dllm_rl.models.cli import InfoConfig
    from dllm_rl.rl.cli import DemoOptions
    from dllm_rl.rl.config import RLConfig
    from dllm_rl.sampling.config import GenerateConfig
    from dllm_rl.serve.config import ServeConfig
    from dllm_rl.sft.config import SFTConfig
    from dllm_rl.tasks.data_config import MakeDataConfig, SandboxCheckConfig, ShowDataConfig

    return [("dllm-rl rl", RLConfig, RLConfig()), ("dllm-rl demo", DemoOptions, DemoOptions()),
            ("dllm-rl sft", SFTConfig, SFTConfig()),
            ("dllm-rl dpo", DPOConfig, DPOConfig()), ("dllm-rl pairs", PairsConfig, None),
            ("dllm-rl eval", EvalRunConfig, EvalRunConfig()), ("dllm-rl trace", TraceConfig, TraceConfig()),
            ("dllm-rl plot", PlotConfig, PlotConfig()), ("dllm-rl generate", GenerateConfig, GenerateConfig()),
            ("dllm-rl serve", ServeConfig, ServeConfig()), ("dllm-rl info", InfoConfig, InfoConfig()),
            ("dllm-rl data make", MakeDataConfig, None), ("dllm-rl data show", ShowDataConfig, None),
            ("dllm-rl data sandbox", SandboxCheckConfig, None)]


def main() -> str:
    from dllm_rl.config.reference import markdown

    return markdown(command_configs())


if __name__ == "__main__":
    print(main(), end="")
