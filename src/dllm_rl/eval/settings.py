"""The settings language of ``dllm-rl eval``: ``--setting NAME:key=value,...`` or a YAML settings file ->
named :class:`Setting` overrides, resolved over the base decoding into a concrete :class:`ResolvedSetting`."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dllm_rl.config import ConfigError, from_dict, to_dict, yaml_load

SETTING_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
#: pseudo-keys a setting may use besides DecodeConfig's fields
SETTING_SHORTCUTS = ("tokens_per_step", "block_cache", "decoding")
#: the setting name of confidence threshold ``t`` on an accuracy-vs-passes curve (``--thresholds``)
THRESHOLD_NAME = "thr{:g}"


@dataclass
class Setting:
    """A named decoding setting: overrides on top of the base DecodeConfig."""

    name: str
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not SETTING_NAME.match(self.name):
            raise ConfigError(f"setting name {self.name!r}: use letters, digits and _ . + - only")


def parse_setting(spec: str) -> Setting:
    """``NAME:key=val,key=val`` (or just ``NAME`` for the base settings) -> :class:`Setting`.

    Keys are :class:`~dllm_rl.sampling.DecodeConfig` fields, or ``tokens_per_step=k`` for a static
    schedule committing k tokens per step in every block (``steps = ceil(block / k)``).
    """
    name, _, rest = spec.partition(":")
    overrides: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        if "=" not in part:
            raise ConfigError(f"--setting {spec!r}: {part!r} must look like key=value "
                             "(for example dyn:threshold=0.9 or static2:tokens_per_step=2)")
        k, v = part.split("=", 1)
        overrides[k.strip().replace("-", "_")] = v.strip()
    return Setting(name.strip(), overrides)


def threshold_settings(thresholds: list[float], base: Mapping[str, Any]) -> list[Setting]:
    """The settings of an accuracy-vs-passes curve: one per confidence threshold (the dynamic schedule: each step
    commits every masked token above it, at least the most confident one), plus threshold 1.0 when not listed,
    the reference every point is compared with: no probability exceeds 1, so it commits one token per step.
    A base static schedule (``steps``) is replaced, the two being exclusive; so is a base ``decoding: learned`` (the
    curve's points keep their fixed thresholds, the curve a learned threshold is compared with)."""
    ts = sorted({float(t) for t in thresholds} | {1.0}, reverse=True)
    bad = [t for t in ts if not 0 < t <= 1]
    if bad:
        raise ConfigError(f"thresholds: {bad[0]:g} is outside (0, 1]; a confidence threshold is a probability")
    clear = {"steps": None} if base.get("steps") is not None else {}
    if base.get("decoding", "config") != "config":
        clear["decoding"] = "config"
    return [Setting(THRESHOLD_NAME.format(t), {**clear, "threshold": t}) for t in ts]


def load_settings_file(path: str | Path) -> list[Setting]:
    """Settings from YAML: a mapping ``name: {key: value, ...}`` or a list of ``{name: ..., key: value}``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: settings file not found")
    data = yaml_load(path.read_bytes(), str(path))
    if isinstance(data, Mapping):
        items = [(str(k), v or {}) for k, v in data.items()]
    elif isinstance(data, list):
        items = []
        for i, entry in enumerate(data):
            if not isinstance(entry, Mapping) or "name" not in entry:
                raise ConfigError(f"{path}: entry {i} must be a mapping with a 'name'")
            items.append((str(entry["name"]), {k: v for k, v in entry.items() if k != "name"}))
    else:
        raise ConfigError(f"{path}: expected a mapping of setting name -> options, or a list of settings")
    out = []
    for name, opts in items:
        if not isinstance(opts, Mapping):
            raise ConfigError(f"{path}: setting {name!r} must map option names to values")
        out.append(Setting(name, {str(k).replace("-", "_"): v for k, v in opts.items()}))
    return out


@dataclass
class ResolvedSetting:
    """A setting made concrete: the DecodeConfig and the extra ``generate`` options (``block_cache``, ``decoding``:
    learned decodes each prompt at the threshold the checkpoint's head gives it, :mod:`dllm_rl.eval.learned`)."""

    decode: Any
    block_cache: bool = True
    decoding: str = "config"

    @property
    def learned(self) -> bool:
        return self.decoding == "learned"

    def as_dict(self) -> dict[str, Any]:
        decode = to_dict(self.decode)
        if decode.get("block_size") is None:  # unset (the model's own block): as recorded before the field existed
            decode.pop("block_size", None)
        # decoding only when learned: evaluations recorded before the key existed still resume
        return {**decode, "block_cache": self.block_cache, **({"decoding": self.decoding} if self.learned else {})}


def resolve_decode(base: Mapping[str, Any], setting: Setting, block_size: int | None = None) -> ResolvedSetting:
    """The decoding of ``setting`` over ``base`` (string values coerced to the DecodeConfig field types).

    Shortcuts: ``tokens_per_step=k`` = a static schedule committing k tokens per step
    (``steps = ceil(block / k)`` per block, block = the model's ``block_size`` for block models, else
    ``block_length``); ``block_cache=false`` = block models decode without their (exact) KV cache.
    ``block_size`` is the model's own block (None for full-attention models); a ``block_size`` key in the
    setting decodes a block model at that block instead. ``decoding`` (``base``'s: eval's ``decoding`` key) is
    config or learned (each prompt at its learned threshold: no schedule of its own, no rcr, the block cache on).
    """
    from dllm_rl.config import coerce
    from dllm_rl.sampling import DecodeConfig

    where = f"setting {setting.name!r}"
    data = {**base, **setting.overrides}
    tps = data.pop("tokens_per_step", None)
    block_cache = coerce(data.pop("block_cache", True), bool, f"{where}: block_cache")
    decoding = _decoding(where, data.pop("decoding", "config"), {**data, "tokens_per_step": tps}, block_cache)
    if not block_cache and block_size is None:
        raise ConfigError(f"{where}: block_cache applies to block models (SDAR/TraDo) only; full-attention models "
                         "choose their cache with cache=none|prefix|dual")
    if tps is not None:
        tps = coerce(tps, int, f"{where}: tokens_per_step")
        if tps < 1:
            raise ConfigError(f"{where}: tokens_per_step must be >= 1")
        if data.get("steps") is not None or data.get("threshold") is not None:
            raise ConfigError(f"{where}: tokens_per_step replaces steps/threshold; give only one of them")
        if block_size is not None and data.get("block_size") is not None:  # a block model at another block
            block_size = coerce(data["block_size"], int, f"{where}: block_size")
        block = block_size or int(data.get("block_length") or DecodeConfig.__dataclass_fields__["block_length"].default)
        data["steps"] = -(-block // tps)
    try:
        decode = from_dict(DecodeConfig, data, where=where)
    except ConfigError as exc:
        msg = str(exc).replace(" valid keys: ", f" valid keys: {', '.join(SETTING_SHORTCUTS)}, ")
        raise ConfigError(msg) from None
    return ResolvedSetting(decode, bool(block_cache), decoding)


def _decoding(where: str, value: Any, data: Mapping[str, Any], block_cache: bool) -> str:
    """A setting's ``decoding`` checked against its other keys (``data``: DecodeConfig's and tokens_per_step)."""
    from dllm_rl.sampling.config import DECODINGS

    if value not in DECODINGS:
        raise ConfigError(f"{where}: decoding: expected one of {', '.join(DECODINGS)}, got {value!r}")
    if value == "config":
        return value
    given = [k for k in ("steps", "threshold", "tokens_per_step") if data.get(k) is not None]
    if given:
        raise ConfigError(f"{where}: decoding=learned chooses each prompt's threshold: drop {', '.join(given)}")
    if data.get("remasking") == "rcr":
        raise ConfigError(f"{where}: decoding=learned decodes with the dynamic schedule, and rcr re-masks on the "
                          "static one; use remasking=low_confidence")
    if not block_cache:
        raise ConfigError(f"{where}: decoding=learned decodes through the engine, which keeps the block cache; drop "
                          "block_cache=false")
    return value
