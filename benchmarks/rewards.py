"""Reward throughput and reward stalls: sandboxed code tests and math-verify checks per second, the
real-file reference answers, and the slowest single scoring call over a fuzz corpus.

    .venv/bin/python benchmarks/rewards.py                 # full: 164 HumanEval x 2 rounds, 500 MATH, fuzz 1000
    .venv/bin/python benchmarks/rewards.py --quick         # smaller throughput samples
    .venv/bin/python benchmarks/rewards.py --fuzz-only --fuzz-n 50   # a quick fuzz pass only
    .venv/bin/python benchmarks/rewards.py --models-only             # reward model and judge throughput only

Prints, from one run:
- HumanEval canonical solutions verified per second in the sandbox (all cores), with the launcher
  (reapers forked from a warm process) and with one Popen'd reaper per run, and their ratio; with and
  without bubblewrap when it is installed;
- math-verify checks per second (MATH-500 reference answers, boxed, exact-match shortcut off);
- the real-file reference answers that score 1.0 through each task's reward (GSM8K test, MATH-500 with
  math-verify and the cost check, countdown) and the rule-based rewards' scores per second;
- fuzz: for gsm8k, math, countdown, sudoku and code, ``--fuzz-n`` junk completions from
  :func:`dllm_rl.tasks.fuzz.junk_completions` (seed ``--fuzz-seed``) scored one call at a time; a
  table of calls, the slowest call (and its family), the mean, and whether the slowest call is within
  the bound: 1 s for every task but code, the code task's configured timeout (``--code-timeout``)
  plus 1 s for starting and reaping the sandbox. Exits 1 when a bound is broken;
- reward models and judges at the demo scale (``--models``, on by default; ``--models-only`` alone): one
  rollout batch of the block demo (16 prompts x 8 completions of up to 32 tokens, countdown) scored by a
  demo-sized Llama reward model and judge (hidden 128, 4 layers, the demo's character tokenizer; random weights,
  built here, so the judge's answers never parse and every judgement is a counted failure); completions/s of
  the reward model at several batch sizes, of the judge in outcome mode (cold and cached) and in process mode
  (8-token chunks), with ``--device`` (default auto).
The code task is used only through ``get_task("code", ...)`` and its attributes, never by import.
Needs the benchmark data folder (``$DLLM_RL_DATA`` or ``<repo>/../shared/data``) except with
``--fuzz-only``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from dllm_rl.tasks import Score, Task, find_data_dir, get_task
from dllm_rl.tasks.fuzz import FUZZ_ROWS, junk_completions
from dllm_rl.tasks.math_task import MathVerifier

FUZZ_BOUND_S = 1.0
SANDBOX_SLACK_S = 1.0


def sandbox_rate(sb, jobs: list, rounds: int) -> tuple[float, int]:
    sb.run(jobs[0])  # warm-up: isolation probe, launcher start
    passed, start = 0, time.perf_counter()
    for _ in range(rounds):
        passed += sum(r.fraction == 1.0 for r in sb.map(jobs))
    return rounds * len(jobs) / (time.perf_counter() - start), passed


def bench_sandbox(data: Path, n_he: int, rounds: int, workers: int, results: dict, lines: list) -> None:
    """HumanEval canonical solutions per second; the sandbox classes come from the code task."""
    he = get_task("humaneval", data=data / "humaneval" / "HumanEval.jsonl.gz", limit=n_he)
    jobs = [he.job_for(ex["canonical_solution"], ex) for ex in he.examples]
    assert not any(isinstance(j, Score) for j in jobs)
    sandbox_cls, limits = type(he.sandbox), type(he.limits)(timeout_s=20)
    fast = sandbox_cls(limits, workers=workers)
    iso = fast.isolation
    lines.append(f"sandbox: {iso.describe()}; {workers} workers; {os.cpu_count()} cpus")
    configs = [("launcher", fast), ("popen_reaper", sandbox_cls(limits, workers=workers, use_launcher=False))]
    if iso.bwrap:
        configs.append(("launcher_no_bwrap", sandbox_cls(limits, workers=workers, use_bwrap=False)))
    for name, sb in configs:
        rate, passed = sandbox_rate(sb, jobs, rounds)
        results[f"humaneval_per_s_{name}"] = rate
        lines.append(f"HumanEval canonical, {name:18s}: {rate:6.1f} solutions/s ({passed}/{rounds * len(jobs)} pass)")
    results["launcher_speedup"] = results["humaneval_per_s_launcher"] / results["humaneval_per_s_popen_reaper"]
    lines.append(f"launcher / popen reaper throughput ratio: {results['launcher_speedup']:.2f}x")
    if iso.bwrap:
        ratio = results["humaneval_per_s_launcher"] / results["humaneval_per_s_launcher_no_bwrap"]
        results["bwrap_cost_ratio"] = ratio
        lines.append(f"bwrap / no-bwrap throughput ratio: {ratio:.2f}x")


def bench_math_verify(data: Path, n_math: int, workers: int, results: dict, lines: list) -> None:
    math = get_task("math", data=data / "math" / "math500_test.jsonl", limit=n_math)
    pairs = [(ex["answer"], ex["answer"]) for ex in math.examples]
    verifier = MathVerifier(workers=workers, timeout_s=5)
    try:
        verifier.check_many(pairs[: workers * 2])  # start the workers (sympy import) before timing
        start = time.perf_counter()
        ok = sum(r[0] for r in verifier.check_many(pairs))
        results["math_verify_per_s"] = len(pairs) / (time.perf_counter() - start)
    finally:
        verifier.close()
    rate = results["math_verify_per_s"]
    lines.append(f"math-verify, MATH-500 answers: {rate:6.1f} checks/s ({ok}/{len(pairs)} equal)")


def bench_references(data: Path, results: dict, lines: list) -> None:
    """Every real-file reference answer through the task's own reward (counts of 1.0 scores)."""
    for name, path, fmt, opts in (
        ("gsm8k", data / "gsm8k" / "test.jsonl", "#### {final_answer}", {}),
        ("math", data / "math" / "math500_test.jsonl", "Thus the answer is $\\boxed{{{answer}}}$.",
         {"exact_shortcut": False}),
        ("countdown", data / "countdown" / "cd3_test.jsonl", None, {}),
    ):  # fmt: skip
        task = get_task(name, data=path, **opts)
        exs = task.examples
        comps = [fmt.format(**ex) if fmt else task.reference_completion(ex) for ex in exs]
        start = time.perf_counter()
        scores = task.score_examples(comps, exs)
        rate = len(exs) / (time.perf_counter() - start)
        ones = sum(s == 1.0 for s in scores)
        results[f"{name}_references_ok"] = ones
        results[f"{name}_references"] = len(exs)
        results[f"{name}_per_s"] = rate
        lines.append(f"{name} reference answers scoring 1.0: {ones}/{len(exs)} ({rate:9.0f} scores/s)")


def fuzz_task(name: str, code_timeout: float) -> tuple[Task, float]:
    """The task scoring the fuzz corpus, warmed up, and its per-call bound in seconds."""
    if name == "code":
        task = get_task("code", data=[FUZZ_ROWS["code"]], dataset=None, timeout_s=code_timeout)
        task.score_examples(["```python\ndef f(x):\n    return x + 1\n```"], task.examples)
        return task, task.limits.timeout_s + SANDBOX_SLACK_S
    task = get_task(name, data=[FUZZ_ROWS[name]])
    if name == "math":
        task.verifier.check_many([("1", "2")] * task.workers)  # start the workers before timing
    return task, FUZZ_BOUND_S


def bench_fuzz(n: int, seed: int, code_timeout: float, results: dict) -> list[str]:
    """Score the fuzz corpus one call at a time; the table rows, and the bound violations."""
    rows, broken = [], []
    rows.append(f"{'task':10s} {'calls':>6s} {'slowest s':>10s} {'mean ms':>9s} {'bound s':>8s} {'within':>7s}  "
                "slowest family")  # fmt: skip
    for name in ("gsm8k", "math", "countdown", "sudoku", "code"):
        task, bound = fuzz_task(name, code_timeout)
        (ex,) = task.examples
        slowest, family, total, calls = 0.0, "", 0.0, 0
        for fam, text in junk_completions(name, n, seed):
            start = time.perf_counter()
            (s,) = task.score_examples([text], [ex])
            dt = time.perf_counter() - start
            if not 0.0 <= s <= 1.0:
                broken.append(f"{name}: score {float(s)} outside [0, 1] ({fam})")
            total, calls = total + dt, calls + 1
            if dt > slowest:
                slowest, family = dt, fam
        ok = slowest <= bound
        if not ok:
            broken.append(f"{name}: slowest call {slowest:.2f} s > {bound:.1f} s ({family})")
        results[f"fuzz_{name}_slowest_s"] = slowest
        results[f"fuzz_{name}_mean_ms"] = 1000 * total / max(calls, 1)
        rows.append(f"{name:10s} {calls:6d} {slowest:10.3f} {1000 * total / max(calls, 1):9.2f} {bound:8.1f} "
                    f"{'yes' if ok else 'NO':>7s}  {family}")  # fmt: skip
        task.close()
    return rows + [f"bound broken: {b}" for b in broken]


def demo_batch(n: int = 128) -> tuple[list[str], list[str]]:
    """``n`` (prompt, completion) pairs of the block demo's size: countdown prompts, 8 completions each, up to
    32 characters (the demo tokenizer's tokens)."""
    from dllm_rl.jsonl import read_jsonl

    demo = Path(__file__).resolve().parents[1] / "src" / "dllm_rl" / "assets" / "demo" / "countdown_train.jsonl"
    rows = list(read_jsonl(demo))[: max(n // 8, 1)]
    prompts = [f"Use {r['input']} to make {r['target']}." for r in rows for _ in range(8)][:n]
    completions = [(f"<answer>{r['solution']}</answer> " * 4)[: 12 + 3 * j] for r in rows for j in range(8)][:n]
    return prompts, completions


def bench_models(device: str, results: dict, lines: list) -> None:
    """Completions/s of a demo-sized reward model and judge on one demo rollout batch."""
    import tempfile

    import torch
    import transformers

    from dllm_rl.models import char_tokenizer
    from dllm_rl.models.tokenizer import CHATML_TEMPLATE
    from dllm_rl.rewards.judge import Judge, JudgeConfig
    from dllm_rl.rewards.reward_model import RewardModel, RewardModelConfig

    prompts, completions = demo_batch()
    n = len(completions)
    tok = char_tokenizer(chat_template=CHATML_TEMPLATE, words=("<|im_start|>", "<|im_end|>"))
    conf = dict(vocab_size=len(tok), hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048, num_labels=1,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    with tempfile.TemporaryDirectory() as tmp:
        for name, cls in (("rm", "LlamaForSequenceClassification"), ("judge", "LlamaForCausalLM")):
            torch.manual_seed(0)
            getattr(transformers, cls)(transformers.LlamaConfig(**conf)).save_pretrained(Path(tmp) / name)
            tok.save_pretrained(Path(tmp) / name)
        lines.append(f"reward models at the demo scale: {n} completions of <= 32 tokens, device {device}, "
                     "demo-sized Llama (hidden 128, 4 layers)")
        for bs in (8, 32, 128):
            rm = RewardModel(RewardModelConfig(model=str(Path(tmp) / "rm"), batch_size=bs, device=device))
            rm(prompts[:bs], completions[:bs])  # warm-up
            start = time.perf_counter()
            rm(prompts, completions)
            rate = n / (time.perf_counter() - start)
            results[f"reward_model_per_s_bs{bs}"] = rate
            lines.append(f"reward model, batch {bs:3d}:                     {rate:8.1f} completions/s")
        base = dict(model=str(Path(tmp) / "judge"), device=device, batch_size=64, max_new_tokens=16)
        judge = Judge(JudgeConfig(**base))
        judge(prompts[:2], completions[:2])  # warm-up (its two prompts are then cached)
        for label, key in (("cold", "judge_outcome_per_s"), ("cached", "judge_outcome_cached_per_s")):
            start = time.perf_counter()
            judge(prompts, completions)
            results[key] = n / (time.perf_counter() - start)
            lines.append(f"judge outcome, 16 new tokens, batch 64, {label:6s}: {results[key]:8.1f} completions/s")
        process = Judge(JudgeConfig(**base, mode="process", chunk_length=8), policy_tokenizer=tok)
        step_maps = [list(range(len(tok(c, add_special_tokens=False)["input_ids"]))) for c in completions]
        start = time.perf_counter()
        process(prompts, completions, step_map=step_maps)
        results["judge_process_per_s"] = n / (time.perf_counter() - start)
        lines.append(f"judge process, 8-token chunks ({process.stats['judge_prompts']} prompts), cold: "
                     f"{results['judge_process_per_s']:8.1f} completions/s")
        lines.append(f"judge failures counted (random weights write no score): {judge.stats['judge_failures']} "
                     f"outcome, {process.stats['judge_failures']} process")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller throughput samples (about 10 s)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel sandboxes / verifiers")
    ap.add_argument("--fuzz-n", type=int, default=1000, help="junk completions per task (0: no fuzz)")
    ap.add_argument("--fuzz-seed", type=int, default=0, help="seed of the fuzz corpus")
    ap.add_argument("--fuzz-only", action="store_true", help="run only the fuzz section (no data needed)")
    ap.add_argument("--code-timeout", type=float, default=3.0, help="sandbox timeout_s of the fuzzed code task")
    ap.add_argument("--models-only", action="store_true", help="run only the reward model and judge section")
    ap.add_argument("--no-models", action="store_true", help="skip the reward model and judge section")
    ap.add_argument("--device", default="auto", help="device of the reward model and judge (auto | cpu | cuda)")
    args = ap.parse_args(argv)
    results: dict[str, float] = {}
    lines: list[str] = []
    if args.models_only:
        bench_models(args.device, results, lines)
        print("\n".join(lines))
        print(json.dumps({k: round(v, 4) for k, v in results.items()}))
        return 0
    if not args.fuzz_only:
        data = find_data_dir()
        if data is None:
            print("benchmark data not found: set DLLM_RL_DATA or provide <repo>/../shared/data", file=sys.stderr)
            return 2
        bench_sandbox(data, 60 if args.quick else 164, 1 if args.quick else 2, args.workers, results, lines)
        bench_math_verify(data, 150 if args.quick else 500, args.workers, results, lines)
        bench_references(data, results, lines)
        print("\n".join(lines), flush=True)
    table: list[str] = []
    if args.fuzz_n > 0:
        print(f"fuzz: {args.fuzz_n} junk completions per task, seed {args.fuzz_seed}, one call each", flush=True)
        table = bench_fuzz(args.fuzz_n, args.fuzz_seed, args.code_timeout, results)
        print("\n".join(table))
    if not args.no_models and not args.fuzz_only:
        lines = []
        bench_models(args.device, results, lines)
        print("\n".join(lines))
    print(json.dumps({k: round(v, 4) for k, v in results.items()}))
    return 1 if any(row.startswith("bound broken") for row in table) else 0


if __name__ == "__main__":
    raise SystemExit(main())
