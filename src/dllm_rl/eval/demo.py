"""The shipped demo checkpoints' evaluation defaults (``dllm-rl eval MODEL_DIR --demo``).

The demo is reported as ``make demo`` reports it: the 500-puzzle held-out countdown file next to the
checkpoints (``assets/demo/countdown_heldout.jsonl``), compact prompts, greedy decoding one token per step in
low-confidence (probability) order, at the ``gen_length`` / ``block_length`` of the demo RL config that trains the
checkpoint (``assets/demo/rl-*.yaml``): ``llada-countdown`` decodes 16 slots as one block (its tokenizer spells
``<answer>`` and ``</answer>`` as one token each), ``sdar-countdown`` 32 slots in its own blocks of 4. Any other
checkpoint: gen_length 32, one block of 32. The vision demo's ``llada_v-shapes`` is evaluated on its own task
(``shapes``) and held-out file (``shapes_heldout.jsonl``), as ``rl-vision.yaml`` names them. A uniform-state demo
(``gemma-countdown``, DiffusionGemma-shaped) has no blocks nor greedy mode: its config names no ``block_length``, and
``--demo`` takes its canvas budget and the sampler knobs it sets (``max_denoising_steps`` ...; the ``eval:``
section's temperatures over the rollouts'), as its RL run's held-out evaluation does;
so does any other checkpoint of a uniform-state family (a ``make demo MODEL=gemma`` run's final model), for which
"one block of 32" means nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEMO_DIR = Path(__file__).resolve().parents[1] / "assets" / "demo"
HELDOUT = DEMO_DIR / "countdown_heldout.jsonl"


def demo_config(model_dir: str | Path) -> dict[str, Any] | None:
    """The demo RL config (``assets/demo/rl-*.yaml``) whose ``model.path`` is ``model_dir``; for another checkpoint
    of a uniform-state family, the config of the shipped demo of that family; else None."""
    import yaml

    configs = [yaml.safe_load(cfg.read_text()) for cfg in sorted(DEMO_DIR.glob("rl-*.yaml"))]
    for data in configs:
        if (DEMO_DIR / data["model"]["path"]).resolve() == Path(model_dir).resolve():
            return data
    family = _uniform_family(model_dir)
    if family is not None:
        for data in configs:
            if _uniform_family(DEMO_DIR / data["model"]["path"]) == family:
                return data
    return None


def _uniform_family(model_dir: str | Path) -> str | None:
    """The family name of the local checkpoint ``model_dir`` when it is uniform-state; None otherwise (or when it
    is no local checkpoint: a hub id's config is not fetched for this)."""
    from dllm_rl.models.families import detect_family
    from dllm_rl.models.loading import read_config

    if not (Path(model_dir) / "config.json").is_file():
        return None
    family = detect_family(read_config(model_dir))
    return family.name if family.noise == "uniform" else None


def decode_lengths(model_dir: str | Path) -> tuple[int, int | None]:
    """``(gen_length, block_length)`` of the demo RL config whose ``model.path`` is ``model_dir``; (32, 32) else.
    ``block_length`` is None where the config names none (a uniform-state demo decodes whole canvases)."""
    data = demo_config(model_dir)
    if data is None:
        return 32, 32
    block = data["rollout"].get("block_length")
    return int(data["rollout"]["gen_length"]), None if block is None else int(block)


def demo_defaults(model_dir: str | Path, decode: dict[str, Any]) -> dict[str, Any]:
    """The evaluation options of ``--demo`` (the demo RL config's task, held-out data and prompt style; the
    Countdown demo's for any other checkpoint) and the base decoding: ``decode`` with ``gen_length`` /
    ``block_length`` filled from :func:`decode_lengths` where not given (``block_length`` follows an explicit
    ``gen_length``)."""
    from dllm_rl.sampling.config import UNIFORM_FIELDS

    decode = dict(decode)
    if decode.get("gen_length") is None:
        gen_length, block_length = decode_lengths(model_dir)
        decode["gen_length"] = gen_length
    else:
        block_length = decode["gen_length"]
    data = demo_config(model_dir)
    rollout = (data or {}).get("rollout", {})
    if "block_length" in rollout or data is None:
        decode.setdefault("block_length", block_length)
    held_out = (data or {}).get("eval", {})
    for key in UNIFORM_FIELDS:  # a uniform-state demo's sampler knobs: its held-out evaluation's, else its rollouts'
        value = held_out.get(key, rollout.get(key))
        if value is not None and decode.get(key) is None:
            decode[key] = value
    if data is None:
        return {"task": "countdown", "data": str(HELDOUT), "prompt_style": "compact", "decode": decode}
    return {"task": data["data"]["task"], "data": str(DEMO_DIR / data["eval"]["data"]),
            "prompt_style": data["data"]["prompt_style"], "decode": decode}
