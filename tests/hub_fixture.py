"""A Hugging Face hub cache built by the test, read offline: nothing here reaches a hub.

The layout is the one ``huggingface_hub`` reads (``models--org--name/snapshots/<commit>/...`` and
``refs/<branch>`` holding the commit), under ``$HF_HOME/hub``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def populate_hub_cache(cache: Path, repo_id: str, files: dict[str, str | bytes | Path], *,
                       repo_type: str = "model", commit: str = COMMIT, branch: str | None = "main") -> Path:
    """Write ``files`` (relative name -> text, bytes or a file to copy) as the snapshot ``commit`` of
    ``repo_id`` in the hub cache ``cache``; ``branch`` (if given) points at it. Returns the snapshot folder."""
    repo = Path(cache) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    for name, content in files.items():
        target = snap / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, target)
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    if branch is not None:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / branch).write_text(commit)
    return snap


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> Path:
    """``HF_HOME`` in a fresh tmp folder with ``HF_HUB_OFFLINE=1``, for this process (the library reads its
    constants at import, so they are patched too) and for subprocesses (environment). Returns the hub cache."""
    import huggingface_hub.constants as hub_constants

    home = tmp_path / "hf-home"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    try:
        import datasets.config as ds_config
    except ImportError:
        ds_config = None
    if ds_config is not None:
        monkeypatch.setattr(ds_config, "HF_DATASETS_CACHE", home / "datasets")
        monkeypatch.setattr(ds_config, "HF_HUB_OFFLINE", True, raising=False)
    return cache
