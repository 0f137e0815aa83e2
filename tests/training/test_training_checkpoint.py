"""Exact checkpoint / resume of weights, optimizer, scheduler, RNGs and data position."""

from __future__ import annotations

import errno
import json
import random
import re
import shutil

import numpy as np
import pytest
import torch
from full_disk import disk_full_at
from safetensors import safe_open

import dllm_rl.training.checkpoint as ck_mod
from dllm_rl.errors import UserError
from dllm_rl.models import build_model, load_model, tiny_config
from dllm_rl.training import (
    OptimConfig,
    build_optimizer,
    build_scheduler,
    checkpoint_name,
    clean_leftovers,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from dllm_rl.training.checkpoint import checkpoint_defect, checkpoint_step
from dllm_rl.training.run_config import RunConfig, resume_checkpoint


def _setup(seed=0):
    dlm = build_model("llada", tiny_config("llada", vocab_size=32, hidden_size=32, intermediate_size=64), seed=seed)
    cfg = OptimConfig(lr=1e-2, warmup_steps=2)
    opt = build_optimizer(dlm, cfg)
    return dlm, opt, build_scheduler(opt, cfg, 10)


def _step(dlm, opt, sched, gen):
    ids = torch.randint(0, 30, (2, 6), generator=gen)
    ids[:, 0] = torch.randint(0, 30, (1,)).item()  # uses the global torch RNG too
    loss = dlm(ids).logits.float().logsumexp(-1).mean() - dlm(ids).logits[..., 5].float().mean()
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def test_checkpoint_restores_everything_exactly(tmp_path):
    dlm, opt, sched = _setup()
    gen = torch.Generator().manual_seed(7)
    for _ in range(2):
        _step(dlm, opt, sched, gen)
    random.seed(1)
    np.random.seed(2)
    head_at_2 = dlm.model.lm_head.weight.detach().clone()
    ck = save_checkpoint(tmp_path / "out" / "checkpoints" / checkpoint_name(2), dlm, optimizer=opt, scheduler=sched,
                         step=2, data_state={"epoch": 1, "offset": 3}, generators={"mask": gen}, extra={"note": "x"})
    files = sorted(p.name for p in ck.iterdir())
    assert files == ["model", "optimizer.pt", "rng_state_rank0.pt", "scheduler.pt", "trainer_state.json"]
    meta = json.loads((ck / "trainer_state.json").read_text())
    assert meta["step"] == 2 and meta["lora"] is False and meta["world_size"] == 1
    # continue the original run for 2 steps, remembering what the RNGs produce
    expect_py, expect_np = random.random(), np.random.rand()
    for _ in range(2):
        _step(dlm, opt, sched, gen)
    want = {k: v.clone() for k, v in dlm.state_dict().items()}
    # a different model, optimizer and generator, restored from the checkpoint, must land on the same weights
    dlm2, opt2, sched2 = _setup(seed=5)
    gen2 = torch.Generator().manual_seed(999)
    random.seed(0)
    state = load_checkpoint(ck, dlm2, optimizer=opt2, scheduler=sched2, generators={"mask": gen2})
    assert state.step == 2 and state.data_state == {"epoch": 1, "offset": 3} and state.extra == {"note": "x"}
    assert random.random() == expect_py and np.random.rand() == expect_np
    for _ in range(2):
        _step(dlm2, opt2, sched2, gen2)
    for k, v in dlm2.state_dict().items():
        assert torch.equal(v, want[k]), k
    assert sched2.get_last_lr() == sched.get_last_lr()
    # the model dir is an ordinary published checkpoint
    with safe_open(str(ck / "model" / "model.safetensors"), "pt") as f:
        assert "model.transformer.wte.weight" in f.keys()  # llada's published names
    assert torch.equal(load_model(ck / "model").model.lm_head.weight, head_at_2)


def test_missing_generator_state_and_world_size_are_errors(tmp_path):
    dlm, opt, sched = _setup()
    ck = save_checkpoint(tmp_path / "ck", dlm, step=1)
    with pytest.raises(ValueError, match="generator 'mask'"):
        load_checkpoint(ck, dlm, generators={"mask": torch.Generator()})
    meta = json.loads((ck / "trainer_state.json").read_text())
    meta["world_size"] = 2
    (ck / "trainer_state.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="world size"):
        load_checkpoint(ck, dlm)
    with pytest.raises(FileNotFoundError, match="optimizer"):
        load_checkpoint(ck, dlm, optimizer=opt, restore_rng_state=False)
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        load_checkpoint(tmp_path, dlm)


def test_latest_prune_and_incomplete_dirs(tmp_path):
    dlm, _, _ = _setup()
    for s in (2, 10, 4):
        save_checkpoint(tmp_path / "checkpoints" / checkpoint_name(s), dlm, step=s)
    (tmp_path / "checkpoints" / (checkpoint_name(12) + ".tmp")).mkdir()  # a crash mid-save
    (tmp_path / "checkpoints" / checkpoint_name(14)).mkdir()  # no trainer_state.json
    assert latest_checkpoint(tmp_path).name == "step-0000010"
    removed = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step-0000002"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000004", "step-0000010"]
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_leftovers_of_a_save_cut_short_are_ignored_and_cleaned(tmp_path, caplog):
    """A kill between the state file and the rename leaves step-N.tmp *with* trainer_state.json: it is no
    checkpoint (the name is parsed strictly), latest names the last complete one, and the clean-up removes it."""
    dlm, _, _ = _setup()
    root = tmp_path / "checkpoints"
    save_checkpoint(root / checkpoint_name(2), dlm, step=2)
    save_checkpoint(root / checkpoint_name(3), dlm, step=3)
    (root / checkpoint_name(3)).rename(root / (checkpoint_name(3) + ".tmp"))  # as the kill leaves it
    assert (root / "step-0000003.tmp" / "trainer_state.json").is_file()
    (root / "step-0000005").mkdir()  # no state file
    (root / "step-0000006").mkdir()
    (root / "step-0000006" / "trainer_state.json").write_text('{"step": 6')  # a state file cut short
    (root / "step-7").mkdir()
    (root / "step-7" / "trainer_state.json").write_text('{"step": 8}')  # names another step
    (root / "notes.txt").write_text("x")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000002"]
    assert latest_checkpoint(tmp_path) == root / "step-0000002"
    assert checkpoint_step(root / "step-0000002") == 2 and checkpoint_step(root / "step-0000003.tmp") is None
    with caplog.at_level("WARNING", logger="dllm_rl.training.checkpoint"):
        removed = clean_leftovers(tmp_path)
    assert [p.name for p in removed] == ["step-0000003.tmp", "step-0000005", "step-0000006", "step-7"]
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt", "step-0000002"]  # not a checkpoint's name: kept
    assert f"{root / 'step-0000003.tmp'}: not a complete checkpoint (a save cut short?); removed" in caplog.text


def test_a_resave_killed_between_its_two_renames_puts_the_old_checkpoint_back(tmp_path, caplog):
    """A save of an existing step moves the old folder aside before renaming its own into place: a kill between
    the two leaves step-N.old.tmp (the only complete copy) and step-N.tmp; the clean-up restores the first."""
    dlm, _, _ = _setup()
    root = tmp_path / "checkpoints"
    path = root / checkpoint_name(4)
    save_checkpoint(path, dlm, step=4, extra={"n": 1})
    save_checkpoint(root / "step-0000004.tmp", dlm, step=4, extra={"n": 2})  # the new save, complete
    path.rename(root / "step-0000004.old.tmp")  # as the kill leaves them
    assert latest_checkpoint(tmp_path) is None
    with caplog.at_level("WARNING", logger="dllm_rl.training.checkpoint"):
        removed = clean_leftovers(tmp_path)
    assert [p.name for p in removed] == ["step-0000004.tmp"]
    assert sorted(p.name for p in root.iterdir()) == ["step-0000004"]
    assert latest_checkpoint(tmp_path) == path and load_checkpoint(path, dlm).extra == {"n": 1}
    assert "put back as step-0000004" in caplog.text


def test_a_save_that_fails_leaves_no_state_file_and_the_old_checkpoint_whole(tmp_path, monkeypatch):
    """The state file is written last: a save that dies on the way (here in the RNG states, the last other
    file) leaves a .tmp folder without one; saving the same step again replaces the old checkpoint."""
    dlm, _, _ = _setup()
    path = tmp_path / "checkpoints" / checkpoint_name(4)
    save_checkpoint(path, dlm, step=4, extra={"n": 1})

    def crash(generators=None):
        raise RuntimeError("killed")

    with monkeypatch.context() as m:
        m.setattr(ck_mod, "capture_rng", crash)
        with pytest.raises(RuntimeError, match="killed"):
            save_checkpoint(path, dlm, step=4, extra={"n": 2})
    tmp = path.with_name(path.name + ".tmp")
    assert (tmp / "model" / "config.json").is_file() and not (tmp / "trainer_state.json").exists()
    assert latest_checkpoint(tmp_path) == path
    assert json.loads((path / "trainer_state.json").read_text())["extra"] == {"n": 1}
    save_checkpoint(path, dlm, step=4, extra={"n": 3})
    assert json.loads((path / "trainer_state.json").read_text())["extra"] == {"n": 3}
    assert sorted(p.name for p in path.parent.iterdir()) == ["step-0000004"]


def test_a_full_disk_during_a_save_says_so_with_the_folder_and_the_size_needed(tmp_path, monkeypatch):
    """ENOSPC while the model is written: a DiskFullError (one line: the folder, the last checkpoint's size,
    the free space), the partial folder removed and the previous checkpoint whole."""
    dlm, opt, sched = _setup()
    root = tmp_path / "checkpoints"
    save_checkpoint(root / checkpoint_name(2), dlm, optimizer=opt, scheduler=sched, step=2)
    need = sum(f.stat().st_size for f in (root / "step-0000002").rglob("*") if f.is_file())

    def full(tmp, *args):
        (tmp / "model").mkdir()
        (tmp / "model" / "model.safetensors").write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck_mod, "_write_main_files", full)
    monkeypatch.setattr(ck_mod.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 12345, 12345))
    with pytest.raises(ck_mod.DiskFullError) as info:
        save_checkpoint(root / checkpoint_name(3), dlm, optimizer=opt, scheduler=sched, step=3)
    assert str(info.value) == (f"no space left on device writing the checkpoint {root / 'step-0000003'}: it needs "
                               f"about {need / 1e3:.1f} KB, 12.3 KB free there; free space (or lower "
                               "keep_checkpoints), then resume the run")
    assert 50e3 < need < 500e3  # the tiny model (~8k parameters) with its AdamW moments
    assert sorted(p.name for p in root.iterdir()) == ["step-0000002"]
    assert isinstance(info.value, UserError)
    monkeypatch.setattr(ck_mod, "_write_main_files", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
    with pytest.raises(OSError, match="I/O"):  # any other OS error is no full disk
        save_checkpoint(root / checkpoint_name(3), dlm, step=3)


def test_a_full_disk_while_the_published_model_is_written_says_so_and_leaves_no_partial_weights(tmp_path,
                                                                                                monkeypatch):
    """RL's final/ and SFT's model/ (save_published): ENOSPC is a DiskFullError naming the folder, the model's
    size, the free space and how to write it again; the partial weights are removed, other files stay."""
    dlm, _, _ = _setup()
    path = tmp_path / "final"
    path.mkdir()
    (path / "notes.txt").write_text("mine\n")

    def full(model, where, tokenizer=None):
        (where / "model.safetensors").write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck_mod, "save_model", full)
    monkeypatch.setattr(ck_mod.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 12345, 12345))
    need = sum(t.numel() * t.element_size() for t in dlm.model.state_dict().values())
    with pytest.raises(ck_mod.DiskFullError) as info:
        ck_mod.save_published(dlm, path, resume_hint="train.resume=auto")
    assert str(info.value) == (f"no space left on device writing the model {path}: it needs about {need / 1e3:.1f} "
                               "KB, 12.3 KB free there; free space, then resume the run (train.resume=auto) to "
                               "write it")
    assert 20e3 < need < 100e3 and isinstance(info.value, UserError)
    assert sorted(p.name for p in path.iterdir()) == ["notes.txt"]
    monkeypatch.setattr(ck_mod, "save_model", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
    with pytest.raises(OSError, match="I/O"):  # any other OS error is no full disk
        ck_mod.save_published(dlm, path)


def _value_file(path):
    """An extra file written as the RL value model's is: ``torch.save`` to a path (torch's C++ writer)."""
    torch.save({"w": torch.zeros(100)}, path)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "value_model.pt"])
def test_a_full_disk_as_each_writer_reports_it_is_a_disk_full_error(tmp_path, monkeypatch, name):
    """A full disk as safetensors (SafetensorError, os error 28), torch.save through a file (RuntimeError with the
    ENOSPC as context) and torch.save to a path (RuntimeError, no error number, no free space left) report it:
    one DiskFullError line with the folder, the size of the last checkpoint and the free space; the partial
    folder removed and the last checkpoint intact."""
    dlm, opt, sched = _setup()
    root = tmp_path / "checkpoints"
    kw = {"optimizer": opt, "scheduler": sched, "extra_files": {"value_model.pt": _value_file}}
    save_checkpoint(root / checkpoint_name(2), dlm, step=2, **kw)
    need = sum(f.stat().st_size for f in (root / "step-0000002").rglob("*") if f.is_file())
    disk_full_at(monkeypatch, root / checkpoint_name(3), names=(name,))
    with pytest.raises(ck_mod.DiskFullError) as info:
        save_checkpoint(root / checkpoint_name(3), dlm, step=3, **kw)
    assert re.fullmatch(rf"no space left on device writing the checkpoint {re.escape(str(root / 'step-0000003'))}: "
                        rf"it needs about {need / 1e3:.1f} KB, \d+\.\d [KMGT]B free there; free space \(or lower "
                        r"keep_checkpoints\), then resume the run", str(info.value))
    assert sorted(p.name for p in root.iterdir()) == ["step-0000002"]
    assert latest_checkpoint(tmp_path) == root / "step-0000002" and checkpoint_defect(root / "step-0000002") is None


def test_a_full_disk_in_safetensors_while_the_published_model_is_written_is_a_disk_full_error(tmp_path,
                                                                                                monkeypatch):
    dlm, _, _ = _setup()
    path = tmp_path / "final"
    disk_full_at(monkeypatch, path)
    with pytest.raises(ck_mod.DiskFullError, match=rf"^no space left on device writing the model {re.escape(str(path))}"
                       r": it needs about \d+\.\d KB, \d+\.\d [KMGT]B free there; free space, then resume the run "):
        ck_mod.save_published(dlm, path)
    assert not list(path.glob("*.safetensors"))  # no partial weights


def _two_checkpoints(tmp_path):
    dlm, opt, sched = _setup()
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        save_checkpoint(root / checkpoint_name(step), dlm, optimizer=opt, scheduler=sched, step=step)
    return dlm, opt, sched, root


def _truncate(file, keep):
    data = file.read_bytes()
    file.write_bytes(data[:keep])
    return len(data)


def test_a_truncated_checkpoint_is_passed_over_by_latest_and_refused_when_named(tmp_path, caplog):
    """The state file lists every file's size: a checkpoint with a file cut short is skipped by latest with one
    warning naming the file (said once however often latest is asked) and refused, in one line naming the file,
    when resumed by name; nothing but sizes is read."""
    dlm, opt, sched, root = _two_checkpoints(tmp_path)
    meta = json.loads((root / "step-0000002" / "trainer_state.json").read_text())
    assert sorted(meta["files"]) == ["model/config.json", "model/model.safetensors", "optimizer.pt",
                                     "rng_state_rank0.pt", "scheduler.pt"]
    file = root / "step-0000002" / "model" / "model.safetensors"
    size = _truncate(file, 100)
    with caplog.at_level("WARNING", logger="dllm_rl.training.checkpoint"):
        assert latest_checkpoint(tmp_path) == root / "step-0000001"
        assert latest_checkpoint(tmp_path) == root / "step-0000001"
    line = (f"{file} is truncated (100 of its {size} bytes): the checkpoint {root / 'step-0000002'} is skipped; "
            f"the newest intact checkpoint is {root / 'step-0000001'}")
    assert [r.getMessage() for r in caplog.records] == [line]
    with pytest.raises(ck_mod.CorruptCheckpointError) as info:
        load_checkpoint(root / "step-0000002", dlm, optimizer=opt, scheduler=sched)
    assert str(info.value) == (f"{file} is truncated (100 of its {size} bytes): the checkpoint "
                               f"{root / 'step-0000002'} cannot be resumed; resume from an earlier checkpoint "
                               "(run.resume=latest takes the newest intact one)")
    assert isinstance(info.value, UserError)
    assert load_checkpoint(root / "step-0000001", dlm, optimizer=opt, scheduler=sched).step == 1
    (root / "step-0000001" / "optimizer.pt").unlink()
    assert latest_checkpoint(tmp_path) is None
    assert checkpoint_defect(root / "step-0000001") == f"{root / 'step-0000001' / 'optimizer.pt'} is missing"


def test_a_checkpoint_saved_without_the_size_list_is_checked_by_its_headers(tmp_path):
    """Checkpoints saved before the state file listed sizes: a safetensors file its header does not cover, a
    torch file without its zip end record, are corrupt; whole ones still load."""
    dlm, opt, sched, root = _two_checkpoints(tmp_path)
    for ck in root.iterdir():
        meta = json.loads((ck / "trainer_state.json").read_text())
        del meta["files"]
        (ck / "trainer_state.json").write_text(json.dumps(meta))
    assert checkpoint_defect(root / "step-0000002") is None
    assert load_checkpoint(root / "step-0000002", dlm, optimizer=opt, scheduler=sched).step == 2
    opt_file = root / "step-0000002" / "optimizer.pt"
    _truncate(opt_file, opt_file.stat().st_size - 30)
    assert checkpoint_defect(root / "step-0000002") == (f"{root / 'step-0000002' / 'optimizer.pt'} is truncated or "
                                                        "corrupt (no zip end record)")
    st_file = root / "step-0000001" / "model" / "model.safetensors"
    _truncate(st_file, st_file.stat().st_size - 100)
    assert checkpoint_defect(root / "step-0000001") == (
        f"{st_file} is truncated or corrupt (Error while deserializing header: incomplete metadata, file not fully "
        "covered)")
    assert latest_checkpoint(tmp_path) is None


def test_a_damaged_file_of_the_right_size_is_named_when_read(tmp_path):
    dlm, opt, sched, root = _two_checkpoints(tmp_path)
    file = root / "step-0000002" / "model" / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[8:16] = b"\xff" * 8  # the header's JSON, size unchanged
    file.write_bytes(bytes(data))
    assert checkpoint_defect(root / "step-0000002") is None  # sizes only
    with pytest.raises(ck_mod.CorruptCheckpointError, match=rf"^{re.escape(str(file))} is corrupt \(Error while "
                       r"deserializing header: .*\): resume from an earlier checkpoint$"):
        load_checkpoint(root / "step-0000002", dlm, optimizer=opt, scheduler=sched)


@pytest.mark.parametrize("word", ["latest", "auto"])
def test_resume_latest_or_auto_with_every_checkpoint_damaged_is_one_line(tmp_path, word):
    """auto does not start a new run over damaged checkpoints (it would write over them); with none at all it
    still does."""
    _two_checkpoints(tmp_path)
    for step in (1, 2):
        (tmp_path / "checkpoints" / checkpoint_name(step) / "scheduler.pt").unlink()
    with pytest.raises(ck_mod.CorruptCheckpointError) as info:
        resume_checkpoint(RunConfig(output_dir=str(tmp_path), resume=word))
    assert str(info.value) == (f"run.resume={word}: every checkpoint in {tmp_path / 'checkpoints'} is damaged (the "
                               "warnings above name the files); restore them, or start afresh with run.overwrite=true")
    assert resume_checkpoint(RunConfig(output_dir=str(tmp_path / "new"), resume="auto")) is None
