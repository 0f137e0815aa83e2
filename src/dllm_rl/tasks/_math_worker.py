"""Worker process for :mod:`dllm_rl.tasks.math_task`: runs math-verify checks, one JSON line per request.

math-verify enforces its own time limits with ``signal.alarm``, which only works in a process's main
thread, so the checks run here (one process per worker, started as a plain script so the parent's
``__main__`` is never re-imported) and the parent applies its own wall-clock timeout on top.

Protocol (stdin -> stdout, one JSON object per line): ``{"id": 1, "gold": "...", "pred": "..."}`` ->
``{"id": 1, "ok": true, "error": null}``. ``{"id": 1, "op": "sleep", "seconds": 5}`` sleeps (used to test
the parent's timeout). The worker prints ``ready`` once its imports are done.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    timeout = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except json.JSONDecodeError:
            continue
        ok, error = False, None
        try:
            if req.get("op") == "sleep":
                time.sleep(float(req.get("seconds", 1)))
            else:
                gold = parse(
                    "\\boxed{" + req["gold"] + "}", extraction_config=configs, parsing_timeout=timeout
                )
                pred = parse(
                    "\\boxed{" + req["pred"] + "}", extraction_config=configs, parsing_timeout=timeout
                )
                if not gold:
                    error = "reference answer did not parse"
                elif not pred:
                    error = "answer did not parse"
                else:
                    ok = bool(verify(gold, pred, timeout_seconds=timeout))
        except Exception as exc:  # noqa: BLE001 - report, never die
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
        out.write(json.dumps({"id": req.get("id"), "ok": ok, "error": error}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
