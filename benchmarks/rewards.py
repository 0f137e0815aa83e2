"""Reward throughput: sandboxed code tests and math-verify checks per second, measured side by side.

    .venv/bin/python benchmarks/rewards.py            # full: 164 HumanEval x 2 rounds, 500 MATH answers
    .venv/bin/python benchmarks/rewards.py --quick    # a smaller sample

Prints, from one run:
- HumanEval canonical solutions verified per second in the sandbox (all cores), with the launcher
  (reapers forked from a warm process) and with one Popen'd reaper per run, and their ratio; with and
  without bubblewrap when it is installed;
- math-verify checks per second (MATH-500 reference answers, boxed, exact-match shortcut off) and
  the cheap rule-based rewards (GSM8K, countdown) for scale.
Needs the benchmark data folder (``$DLLM_RL_DATA`` or ``<repo>/../shared/data``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from dllm_rl.sandbox import Job, Sandbox, SandboxLimits
from dllm_rl.tasks import find_data_dir, get_task
from dllm_rl.tasks.code import CodeTask
from dllm_rl.tasks.math_task import MathVerifier


def humaneval_jobs(task: CodeTask) -> list[Job]:
    jobs = []
    for ex in task.examples:
        job = task.job_for(ex["canonical_solution"], ex)
        assert isinstance(job, Job)
        jobs.append(job)
    return jobs


def sandbox_rate(sb: Sandbox, jobs: list[Job], rounds: int) -> tuple[float, int]:
    sb.run(jobs[0])  # warm-up: isolation probe, launcher start
    passed, start = 0, time.perf_counter()
    for _ in range(rounds):
        passed += sum(r.fraction == 1.0 for r in sb.map(jobs))
    return rounds * len(jobs) / (time.perf_counter() - start), passed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller samples (about 10 s)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel sandboxes / verifiers")
    args = ap.parse_args(argv)
    data = find_data_dir()
    if data is None:
        print("benchmark data not found: set DLLM_RL_DATA or provide <repo>/../shared/data", file=sys.stderr)
        return 2
    rounds = 1 if args.quick else 2
    n_he = 60 if args.quick else 164
    n_math = 150 if args.quick else 500
    results: dict[str, float] = {}
    lines = []

    he = get_task("humaneval", data=data / "humaneval" / "HumanEval.jsonl.gz", limit=n_he)
    jobs = humaneval_jobs(he)
    limits = SandboxLimits(timeout_s=20)
    fast = Sandbox(limits, workers=args.workers)
    iso = fast.isolation
    lines.append(f"sandbox: {iso.describe()}; {args.workers} workers; {os.cpu_count()} cpus")
    popen = Sandbox(limits, workers=args.workers, use_launcher=False)
    configs = [("launcher", fast), ("popen_reaper", popen)]
    if iso.bwrap:
        configs.append(("launcher_no_bwrap", Sandbox(limits, workers=args.workers, use_bwrap=False)))
    for name, sb in configs:
        rate, passed = sandbox_rate(sb, jobs, rounds)
        results[f"humaneval_per_s_{name}"] = rate
        total = rounds * len(jobs)
        lines.append(f"HumanEval canonical, {name:18s}: {rate:6.1f} solutions/s ({passed}/{total} pass)")
    results["launcher_speedup"] = (
        results["humaneval_per_s_launcher"] / results["humaneval_per_s_popen_reaper"]
    )
    lines.append(f"launcher / popen reaper throughput ratio: {results['launcher_speedup']:.2f}x")
    if iso.bwrap:
        ratio = results["humaneval_per_s_launcher"] / results["humaneval_per_s_launcher_no_bwrap"]
        results["bwrap_cost_ratio"] = ratio
        lines.append(f"bwrap / no-bwrap throughput ratio: {ratio:.2f}x")

    math = get_task("math", data=data / "math" / "math500_test.jsonl", limit=n_math)
    pairs = [(ex["answer"], ex["answer"]) for ex in math.examples]
    verifier = MathVerifier(workers=args.workers, timeout_s=5)
    verifier.check_many(pairs[: args.workers * 2])  # start the workers (sympy import) before timing
    start = time.perf_counter()
    ok = sum(r[0] for r in verifier.check_many(pairs))
    results["math_verify_per_s"] = len(pairs) / (time.perf_counter() - start)
    verifier.close()
    rate = results["math_verify_per_s"]
    lines.append(f"math-verify, MATH-500 answers: {rate:6.1f} checks/s ({ok}/{len(pairs)} equal)")

    for name, path, fmt in (
        ("gsm8k", data / "gsm8k" / "test.jsonl", "#### {final_answer}"),
        ("countdown", data / "countdown" / "cd3_test.jsonl", None),
    ):
        task = get_task(name, data=path)
        exs = task.examples
        comps = [fmt.format(**ex) if fmt else task.reference_completion(ex) for ex in exs]
        start = time.perf_counter()
        task.score_examples(comps, exs)
        results[f"{name}_per_s"] = len(exs) / (time.perf_counter() - start)
        lines.append(f"{name} rule-based reward: {results[f'{name}_per_s']:9.0f} scores/s")

    print("\n".join(lines))
    print(json.dumps({k: round(v, 2) for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
