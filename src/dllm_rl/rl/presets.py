"""The presets, derived from the methods' declarations (:mod:`dllm_rl.rl.methods`): :data:`PRESETS`, the papers,
and every text that lists them (the preset table of ``--help-config``, the "Preset:" clauses of the config help and
the table of ``docs/methods.md``, which ``make docs`` writes).

This module reads the methods only, not the RL config, so the config may take its choices and help from it;
filling a config from a preset and checking it is :mod:`dllm_rl.rl.algorithms`.
"""

from __future__ import annotations

from typing import Any

from dllm_rl.rl.methods import METHODS

#: Each method's preset, by name: ``{config key: value}`` (paper defaults: each method's module,
#: :mod:`dllm_rl.rl.methods`, says where each value comes from; tuned demo settings live in the demo configs,
#: src/dllm_rl/assets/demo). "shrinkage" of the trace estimator is resolved per attention kind (TraceRL: s=1 block,
#: s=8 full); SPG's block_length, and the trace estimator's with step_merge, follow the rollout's decoding block.
#: Settings a preset cannot hold (lr, train.num_iterations, lengths) are in each method's recipe in configs/.
PRESETS: dict[str, dict[str, Any]] = {name: m.preset.fields() for name, m in METHODS.items()}
#: Each method's paper, by name.
PAPERS: dict[str, str] = {name: m.paper for name, m in METHODS.items()}
#: PPO's clip range, which a preset leaves as it is unless its paper changes it (shown only then).
DEFAULT_CLIP = (0.2, None)


def _clip(preset: dict[str, Any]) -> str | None:
    """A preset's clip range as the tables show it (``0.2/0.28``), or None when it is PPO's 0.2."""
    eps, high = preset["epsilon"], preset["epsilon_high"]
    if (eps, high) == DEFAULT_CLIP:
        return None
    return f"{_shown(eps)}/{_shown(eps if high is None else high)}"


def preset_table() -> list[str]:
    """One line per preset: its paper and the fields it fills (for ``dllm-rl rl --help-config``)."""
    lines = ["presets (algorithm=NAME fills the fields left unset; anything you set wins):"]
    for name, preset in PRESETS.items():
        parts = [f"estimator={preset['estimator']}{preset['estimator_options'] or ''}", f"loss={preset['loss_type']}"]
        if preset["loss_options"]:
            parts.append(f"loss_options={preset['loss_options']}")
        if _clip(preset):
            parts.append(f"clip={_clip(preset)}")
        parts += [f"aggregation={preset['loss_aggregation']}", f"beta={preset['beta']}", f"kl={preset['kl_estimator']}",
                  f"advantage={preset['advantage']}/{preset['scale_rewards']}", f"noise={preset['estimator_noise']}"]
        if preset["rollout_hook"]:
            parts.append(f"hook={preset['rollout_hook']}")
        lines.append(f"  {name} ({PAPERS[name]}): " + ", ".join(parts))
    return lines


def _shown(value: Any) -> str:
    """A preset value as the help and the tables print it (``{num_mc: 2}``, ``0.01``, ``none``)."""
    if value is None:
        return "none"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def preset_clause(key: str) -> str:
    """The "Preset: ..." clause of config field ``key``'s help: each value the presets give it and which presets
    give it, the most common one last as "otherwise" (derived from the methods' modules)."""
    by_value: dict[str, list[str]] = {}
    for name, preset in PRESETS.items():
        by_value.setdefault(_shown(preset[key]), []).append(name)
    common = max(by_value, key=lambda v: len(by_value[v]))
    parts = [f"{value} for {', '.join(names)}" for value, names in by_value.items() if value != common]
    return "Preset: " + "; ".join(parts + [f"{common} otherwise" if parts else f"{common} for every preset"])


def algorithm_help() -> str:
    """The help of ``algorithm``: every preset with its paper."""
    listed = " | ".join(f"{name} ({paper})" for name, paper in PAPERS.items())
    return f"preset that fills the None fields: {listed}; the preset table is printed at the end of --help-config"


TABLE_HEADER = ("| preset | paper | estimator | policy loss | beta (KL) | advantage / scaling | rollout hook | "
                "recipe |",
                "|---|---|---|---|---|---|---|---|")


def methods_table() -> list[str]:
    """The preset table of ``docs/methods.md``, one row per method (``make docs`` writes it; a test checks it)."""
    rows = list(TABLE_HEADER)
    for name, method in METHODS.items():
        p = PRESETS[name]

        def cell(code: str, note_key: str, extra: str = "", notes=method.notes) -> str:
            note = notes.get(note_key)
            return f"`{code}`{extra}" + (f" ({note})" if note else "")

        opts = p["estimator_options"]
        beta = f"{_shown(p['beta'])} ({p['kl_estimator']})" if p["beta"] else "0"
        hook = cell(p["rollout_hook"], "hook") if p["rollout_hook"] else "-"
        clip = f", clip {_clip(p)}" if _clip(p) else ""
        rows.append(" | ".join([
            f"| `{name}`", method.paper, cell(p["estimator"], "estimator", f" {_shown(opts)}" if opts else ""),
            cell(p["loss_type"], "loss", f", {p['loss_aggregation']}{clip}"), beta,
            f"`{p['advantage']}` / {p['scale_rewards']}", hook, f"`{method.recipe}` |"]))
    return rows
