"""Models (and dataset repositories) by Hugging Face hub id or local path, and pushing a saved model.

Every command that takes a model accepts a local directory or a hub id ``org/name`` (``org/name@REVISION``
pins a branch, tag or commit). A hub id goes through :func:`huggingface_hub.snapshot_download`, so the
cache is the hub's own (``HF_HOME`` / ``HF_HUB_CACHE``), ``HF_HUB_OFFLINE=1`` reads only what is cached
(``local_files_only``), and a model downloaded once is shared with every other HF tool.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from dllm_rl.errors import UserError

#: what a model snapshot needs: config, safetensors weights (sharded or not), tokenizer files. Pickled
#: ``*.bin`` / ``*.pth`` duplicates and remote code are never fetched (we load neither).
MODEL_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def split_revision(spec: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; no ``@``: revision None."""
    name, sep, rev = str(spec).partition("@")
    return name, (rev if sep and rev else None)


def is_hub_id(spec: str | Path) -> bool:
    """True for ``org/name`` (optionally ``@revision``) that is not an existing local path."""
    text = str(spec)
    if Path(text).expanduser().exists():
        return False
    name, _ = split_revision(text)
    return bool(_REPO_ID.match(name)) and not name.startswith((".", "/")) and ".." not in name


def check_repo_id(value: str) -> str | None:
    """What is wrong with a hub repository id (None: fine), for the config checks (``push_to_hub``)."""
    return None if _REPO_ID.match(str(value)) else f"{value!r} is not a hub repository id (expected 'org/name')"


def offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set: only the local hub cache is read."""
    return bool(constants.HF_HUB_OFFLINE)


def resolve_model_path(spec: str | Path, revision: str | None = None) -> Path:
    """The local directory of a model given as a path or a hub id (see the module docs).

    A path that exists is returned as is; ``org/name[@rev]`` is downloaded into (or, offline, read from) the
    hub cache. Raises :class:`~dllm_rl.errors.UserError` naming the id, the revision and the cache when the
    model is neither a local directory nor in the cache (offline) nor on the hub."""
    text = str(spec)
    if not is_hub_id(text):
        return Path(text).expanduser()
    name, rev = split_revision(text)
    return _snapshot(name, revision or rev, "model", constants.HF_HUB_CACHE, offline())


def resolve_dataset_repo(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot of a hub *dataset* repository (same cache, offline rule and errors as models)."""
    return _snapshot(repo_id, revision, "dataset", constants.HF_HUB_CACHE, offline())


@lru_cache(maxsize=64)  # one hub look-up per id, revision, cache and mode in a process
def _snapshot(repo_id: str, revision: str | None, repo_type: str, cache: str, is_offline: bool) -> Path:
    where = f"{repo_type} {repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    try:  # the hub's own rule for ids, checked before any look-up: "../x", "", "a/b/c", "a/b-" are refused
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        local = "directory" if repo_type == "model" else "file"
        raise UserError(f"{where} is not a local {local} and not a hub repository id ({exc}); give an existing "
                        f"local {local} or a hub id 'owner/name'") from None
    try:
        path = snapshot_download(repo_id, repo_type=repo_type, revision=revision, cache_dir=cache,
                                 local_files_only=is_offline,
                                 allow_patterns=list(MODEL_FILES) if repo_type == "model" else None)
    except LocalEntryNotFoundError:
        if is_offline:
            raise UserError(f"{where} is not a local directory and not in the hub cache {cache} (HF_HUB_OFFLINE "
                            f"is set): download it first (`hf download {repo_id}{_rt(repo_type)}` with network) or "
                            "unset HF_HUB_OFFLINE") from None
        raise UserError(f"{where} is not a local directory and could not be downloaded into the hub cache {cache} "
                        "(no connection to the hub?): check the network or pass a local directory") from None
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise UserError(f"{where}: no such repository on the hub, or it is private or gated ({type(exc).__name__}); "
                        "check the id, or log in with `hf auth login`") from None
    except RevisionNotFoundError:
        raise UserError(f"{where}: the hub repository has no such revision (branch, tag or commit)") from None
    except HfHubHTTPError as exc:
        raise UserError(f"{where}: the hub answered {exc}") from None
    return Path(path)


def _rt(repo_type: str) -> str:
    return "" if repo_type == "model" else f" --repo-type {repo_type}"


def push_to_hub(folder: str | Path, repo_id: str, *, commit_message: str = "Upload with dllm-rl",
                private: bool | None = None, api=None) -> str:
    """Upload a saved model directory to the hub repository ``repo_id`` (created if missing); returns the
    commit URL. ``api``: an ``HfApi`` (default: a new one, with the token of ``hf auth login`` / ``HF_TOKEN``)."""
    from huggingface_hub import HfApi

    if not _REPO_ID.match(str(repo_id)):
        raise UserError(f"push_to_hub: {repo_id!r} is not a hub repository id (expected 'org/name')")
    if offline():
        raise UserError(f"push_to_hub={repo_id}: HF_HUB_OFFLINE is set; unset it to upload")
    api = api or HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                             commit_message=commit_message)
    return str(getattr(info, "commit_url", info))
