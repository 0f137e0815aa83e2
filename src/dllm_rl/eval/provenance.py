"""Provenance of an evaluation: what its numbers depend on (model and data hashes, software and device), kept in
``meta.json``, and the check that refuses to resume a directory holding a different evaluation."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: what a resumed evaluation must share with the one that wrote the directory
FINGERPRINT_KEYS = ("model", "task", "split", "data", "num_samples", "seed", "seed_rule", "dtype", "prompt_style",
                    "system_prompt", "task_options")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def model_fingerprint(model_dir: Path, full_hash_limit: int = 2 << 30) -> dict[str, Any]:
    """Hashes identifying a checkpoint: config.json, and each weight file in full (up to 2 GiB in total)
    or, for large checkpoints, its size plus the hash of its first and last MiB."""
    files = sorted(model_dir.glob("*.safetensors"))
    total = sum(f.stat().st_size for f in files)
    weights = {}
    for f in files:
        if total <= full_hash_limit:
            weights[f.name] = sha256_file(f)
        else:
            h = hashlib.sha256()
            size = f.stat().st_size
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 20))
                fh.seek(max(0, size - (1 << 20)))
                h.update(fh.read())
            weights[f.name] = f"size={size},head+tail-sha256={h.hexdigest()}"
    return {"path": str(model_dir.resolve()), "config_sha256": sha256_file(model_dir / "config.json"),
            "weights": weights}


def environment(device, dtype) -> dict[str, Any]:
    import torch
    import transformers

    from dllm_rl.version import __version__

    env = {"dllm_rl": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version(), "platform": platform.platform(), "device": str(device),
           "dtype": str(dtype).removeprefix("torch."),
           "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    else:
        env["device_name"] = platform.processor() or platform.machine()
        env["torch_threads"] = torch.get_num_threads()
    try:
        import subprocess

        repo = Path(__file__).resolve().parents[3]
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5)
        if commit.returncode == 0:
            env["git_commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return env


def data_fingerprint(task, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    src = task.source
    info: dict[str, Any] = {"source": src, "items": len(examples)}
    p = Path(src)
    if p.is_file():
        info["sha256"] = sha256_file(p)
    info["examples_sha256"] = hashlib.sha256(
        "\n".join(json.dumps(ex, sort_keys=True, default=str) for ex in examples).encode()).hexdigest()
    return info




def check_resume(out: Path, meta: Mapping[str, Any], overwrite: bool) -> None:
    meta_file = out / "meta.json"
    if overwrite or not meta_file.is_file():
        return
    try:
        old = json.loads(meta_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{meta_file}: not valid JSON ({exc}); use --overwrite to start again") from None
    for key in FINGERPRINT_KEYS:
        a, b = old.get(key), meta.get(key)
        if key == "model" and isinstance(a, dict) and isinstance(b, dict):
            a, b = ({k: a.get(k) for k in ("config_sha256", "weights")},
                    {k: b.get(k) for k in ("config_sha256", "weights")})
        if key == "data" and isinstance(a, dict) and isinstance(b, dict):
            a, b = a.get("sha256", a.get("examples_sha256")), b.get("sha256", b.get("examples_sha256"))
        if json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            raise ValueError(f"{out} holds results of a different evaluation ({key} differs: {a!r} vs {b!r}); "
                             "choose another --output or pass --overwrite")
    for name, s in meta["settings"].items():
        prev = old.get("settings", {}).get(name)
        if prev is not None and json.dumps(prev["decode"], sort_keys=True) != json.dumps(s["decode"], sort_keys=True):
            raise ValueError(f"{out}: setting {name!r} was run with different decoding options "
                             f"({prev['decode']} vs {s['decode']}); rename the setting, choose another --output "
                             "or pass --overwrite")


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)


def merge_meta(out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """meta.json keeps the settings of earlier runs in this directory and the environment of each run."""
    meta_file = out / "meta.json"
    merged = dict(meta)
    if meta_file.is_file():
        old = json.loads(meta_file.read_text())
        merged["settings"] = {**old.get("settings", {}), **meta["settings"]}
        runs = old.get("runs", [old.get("environment")])
        merged["runs"] = [r for r in runs if r] + [meta["environment"]]
    else:
        merged["runs"] = [meta["environment"]]
    return merged
