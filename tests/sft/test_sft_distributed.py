"""Two real gloo ranks on CPU (``accelerate launch --multi_gpu --num_processes 2``): the same script trains and
checkpoints one RNG file per rank. (Exact resume is tested in one process; one launch costs ~30 s here.)"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
from two_ranks import free_port, run_ranks

pytestmark = pytest.mark.slow


def _launch(tmp_path, *extra):
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    if accelerate is None:
        pytest.skip("the accelerate launcher is not installed next to this python")
    data = tmp_path / "d.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "response": str(a + b)}) + "\n"
                                for a in range(5) for b in range(4)))
    cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "-m", "dllm_rl", "sft", "model.tokenizer=char",
           "model.alphabet=0123456789+=", "model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=32",
           f"data.train_file={data}", "train.max_steps=4", "run.save_every=2", "train.micro_batch_size=2",
           f"run.output_dir={tmp_path / 'run'}", "train.log_every=1", "train.num_threads=1", "run.progress=false",
           *extra]
    cmd[2:2] = ["--main_process_port", str(free_port())]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rc, log = run_ranks(cmd, env, tmp_path, 240, "2-rank SFT run hung")
    assert rc == 0, log[-5000:]
    return log


def test_two_cpu_ranks_train_and_checkpoint(tmp_path):
    out = _launch(tmp_path)
    assert "sft: step 4/4" in out and out.count("data: ") == 1  # only the main rank prints
    ck = tmp_path / "run" / "checkpoints" / "step-0000004"
    assert (ck / "rng_state_rank0.pt").is_file() and (ck / "rng_state_rank1.pt").is_file()
    assert json.loads((ck / "trainer_state.json").read_text())["world_size"] == 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()
