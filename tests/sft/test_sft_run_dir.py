"""The SFT run directory: a real run killed while it writes a checkpoint resumes with train.resume=auto; an
old run is refused without train.resume / train.overwrite, and train.overwrite starts afresh."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dllm_rl.config import load_config
from dllm_rl.sft.config import SFTConfig
from dllm_rl.sft.trainer import SFTTrainer
from dllm_rl.training import RunDirError
from dllm_rl.training.checkpoint import KILL_ENV

ROWS = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a in range(4) for b in range(3)]


def _overrides(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return ["model.tokenizer=char", "model.alphabet=0123456789+=", "model.hidden_size=32", "model.num_layers=1",
            "model.num_heads=2", "model.num_kv_heads=2", "model.intermediate_size=64", f"data.train_file={data}",
            "data.max_length=16", "train.batch_size=4", "train.max_steps=3", "train.progress=false",
            f"train.output_dir={tmp_path / 'run'}", "train.log_every=1", "train.save_every=1",
            "train.keep_checkpoints=3", "train.num_threads=1"]


def _sft(args, **env):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, "-m", "dllm_rl", "sft", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_run_killed_while_writing_a_checkpoint_resumes_with_resume_auto(tmp_path):
    args = _overrides(tmp_path)
    out = tmp_path / "run"
    killed = _sft(args, **{KILL_ENV: "2"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000001", "step-0000002.tmp"]
    assert (ckpts / "step-0000002.tmp" / "trainer_state.json").is_file()
    with pytest.raises(RunDirError, match=rf"train.output_dir={out} already holds a run .*pass train.resume=auto"):
        SFTTrainer(load_config(SFTConfig, None, args), verbose=False)

    resumed = _sft([*args, "train.resume=auto"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"sft: resumed from {ckpts / 'step-0000001'} at step 1" in resumed.stdout
    assert f"{ckpts / 'step-0000002.tmp'}: not a complete checkpoint (a save cut short?); removed" in resumed.stderr
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000001", "step-0000002", "step-0000003"]
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert (out / "model" / "model.safetensors").is_file()

    (out / "notes.txt").write_text("kept")
    again = SFTTrainer(load_config(SFTConfig, None, [*args, "train.overwrite=true", "train.max_steps=1"]),
                       verbose=False)
    again.run()
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000001"]
    assert (out / "notes.txt").read_text() == "kept"
