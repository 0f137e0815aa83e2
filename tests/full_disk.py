"""A full disk where a run writes one model folder (RL's ``final/``, SFT's ``model/``): the model writer that
checkpoints and published models share raises ENOSPC there only, as a real full disk would."""

from __future__ import annotations

import errno
from pathlib import Path

import dllm_rl.training.checkpoint as checkpoint


def disk_full_at(monkeypatch, folder: Path) -> None:
    """Until ``monkeypatch.undo()``, writing a model into ``folder`` raises ``OSError(ENOSPC)``; other folders (the
    checkpoints' ``model/``) are written."""
    real = checkpoint.save_model

    def writer(dlm, path, **kw):
        if Path(path) == folder:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(dlm, path, **kw)

    monkeypatch.setattr(checkpoint, "save_model", writer)
