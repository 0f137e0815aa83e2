"""Run as a script (a fresh process, so trackio reads $TRACKIO_DIR): log 3 rows through MetricsLogger with
report_to=[trackio], finish, read them back from trackio's local database and print them as JSON."""

import json
import sys
from pathlib import Path

from dllm_rl.training import MetricsLogger

run_dir = Path(sys.argv[1])
log = MetricsLogger(run_dir / "metrics.jsonl", report_to=["trackio"], config={"optim": {"lr": 0.001}, "seed": 3})
for step in (1, 2, 3):
    log.log(step, reward=step / 4, kl=0.5 * step, phase="train")
log.close()

from trackio.sqlite_storage import SQLiteStorage  # noqa: E402 - after the run, from the same local database

logs = SQLiteStorage.get_logs("dllm-rl", run_dir.name)
config = SQLiteStorage.get_run_config("dllm-rl", run_dir.name) or {}
print(json.dumps({"logs": [{k: v for k, v in r.items() if k in ("step", "reward", "kl")} for r in logs],
                  "config": {k: v for k, v in config.items() if not k.startswith("_")}}))
