"""Models by hub id: read from a hub cache the test builds, offline (HF_HUB_OFFLINE=1); push with a fake HfApi."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_fixture import populate_hub_cache

from dllm_rl.errors import UserError
from dllm_rl.hub import is_hub_id, push_to_hub, resolve_model_path, split_revision
from dllm_rl.models import load_model, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "src" / "dllm_rl" / "assets" / "demo" / "sdar-countdown"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def _cache_demo(cache: Path, repo_id: str = "test-org/tiny-sdar", **kw) -> Path:
    return populate_hub_cache(cache, repo_id, {p.name: p for p in DEMO.iterdir()}, **kw)


def test_hub_id_and_revision_parsing(tmp_path):
    assert split_revision("GSAI-ML/LLaDA-8B-Instruct@v1.0") == ("GSAI-ML/LLaDA-8B-Instruct", "v1.0")
    assert split_revision("Gen-Verse/TraDo-4B-Instruct") == ("Gen-Verse/TraDo-4B-Instruct", None)
    assert is_hub_id("Gen-Verse/TraDo-4B-Instruct") and is_hub_id("org/name@main")
    assert not is_hub_id("./org/name") and not is_hub_id("/abs/model") and not is_hub_id("a/b/c")
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not is_hub_id(tmp_path / "org" / "name")  # an existing folder is a path, whatever its shape
    assert resolve_model_path(tmp_path / "org" / "name") == tmp_path / "org" / "name"


def test_model_by_hub_id_loads_from_the_cache_offline(offline_hub):
    snap = _cache_demo(offline_hub)
    assert resolve_model_path("test-org/tiny-sdar") == snap
    dlm = load_model("test-org/tiny-sdar")
    assert dlm.family.name == "sdar" and dlm.block_size == 4
    tok = load_tokenizer("test-org/tiny-sdar", mask_token_id=dlm.mask_token_id)
    assert tok.mask_token_id == dlm.mask_token_id
    assert dlm.num_parameters() == load_model(DEMO).num_parameters()


def test_revision_selects_that_snapshot(offline_hub):
    main = _cache_demo(offline_hub)
    pinned = _cache_demo(offline_hub, commit=OTHER, branch=None)
    assert resolve_model_path("test-org/tiny-sdar") == main
    assert resolve_model_path(f"test-org/tiny-sdar@{OTHER}") == pinned
    assert resolve_model_path("test-org/tiny-sdar", revision=OTHER) == pinned


def test_absent_model_names_the_id_and_the_cache(offline_hub):
    with pytest.raises(UserError) as err:
        resolve_model_path("test-org/absent@v2")
    assert str(err.value) == (
        f"model 'test-org/absent' at revision 'v2' is not a local directory and not in the hub cache {offline_hub} "
        "(HF_HUB_OFFLINE is set): download it first (`hf download test-org/absent` with network) or unset "
        "HF_HUB_OFFLINE")


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "dllm_rl", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_cli_info_by_hub_id_honours_hf_home_and_offline(offline_hub):
    """The environment alone (HF_HOME, HF_HUB_OFFLINE) steers a fresh process."""
    _cache_demo(offline_hub)
    ok = _cli("info", "test-org/tiny-sdar")
    assert ok.returncode == 0, ok.stderr
    lines = dict(line.split(None, 1) for line in ok.stdout.splitlines())
    assert lines["family"] == "sdar" and lines["attention"] == "block-causal (block_size 4)"


def test_cli_info_of_an_absent_hub_id_is_one_line(offline_hub, capsys):
    from dllm_rl.cli import main

    assert main(["info", "test-org/absent"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"dllm-rl info: error: model 'test-org/absent' is not a local directory and not in the hub cache "
        f"{offline_hub} (HF_HUB_OFFLINE is set): download it first (`hf download test-org/absent` with network) "
        "or unset HF_HUB_OFFLINE")


class FakeApi:
    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))

    def upload_folder(self, **kw):
        self.calls.append(("upload_folder", kw))
        return type("Info", (), {"commit_url": f"https://hub.example/{kw['repo_id']}/commit/1"})()


def test_push_to_hub_uploads_the_folder(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    api = FakeApi()
    url = push_to_hub(tmp_path, "me/tiny-rl", api=api)
    assert url == "https://hub.example/me/tiny-rl/commit/1"
    assert api.calls == [
        ("create_repo", "me/tiny-rl", {"repo_type": "model", "private": None, "exist_ok": True}),
        ("upload_folder", {"repo_id": "me/tiny-rl", "folder_path": str(tmp_path), "repo_type": "model",
                           "commit_message": "Upload with dllm-rl"}),
    ]
    with pytest.raises(UserError, match="'not a repo' is not a hub repository id"):
        push_to_hub(tmp_path, "not a repo", api=api)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match="HF_HUB_OFFLINE is set; unset it to upload"):
        push_to_hub(tmp_path, "me/tiny-rl", api=api)
