"""Does RL learn? Held-out greedy accuracy before and after RL from the shipped demo checkpoints.

    python benchmarks/learning.py                       # the README table: every method x model, 2 seeds
    python benchmarks/learning.py --runs full:espo --seeds 0 --minutes 3   # one quick run
    python benchmarks/learning.py --runs full:espo --seeds 0 1 --steps 250 # equal updates, any machine speed
    python benchmarks/learning.py --runs full:espo --seeds 0 1 2 --report  # the table of finished runs only
    python benchmarks/learning.py --plain --steps 40 --out runs/learning-40  # each method, 40 updates (docs/results.md)
    python benchmarks/learning.py --runs full:dpo --seeds 0 1 2    # DPO (VRPO) on the model's own answer pairs

Each run is `dllm-rl rl` on the demo config (``src/dllm_rl/assets/demo/rl-<model>.yaml``, with the algorithm's
recipe laid over it where the demo has one, as ``dllm-rl demo`` does; ``--plain`` leaves it out) with a training
time budget (``max_time_minutes``, counted from the start of the run, so it includes the held-out evaluation
before training; the default 9.2 keeps each whole run, both evaluations included, under 10 minutes), one CPU
thread (plus the method's own demo settings, ``METHOD_EXTRA``), evaluated on ``--eval-limit`` held-out
problems before and after. Runs go ``--parallel`` at a time.
Each Countdown run (models ``full`` and ``block``) is also evaluated, before and after, on a second held-out
set: the demo-shaped puzzles that neither the training file nor the held-out file contains (the rare shapes,
``benchmarks/rare_shapes.py``; the "before" number is the demo checkpoint's, measured once per model); the
``vision`` model's runs (the shapes image task) and the ``gemma`` model's (DiffusionGemma-shaped, whose sampler
has no greedy mode: its held-out accuracy samples under the evaluation's fixed seeds) have the held-out set only.
Prints a Markdown table (method x model: before, after per seed, gain, rare shapes before and after, held-out forward
passes per answer before and after with the tokens per forward after (the summary's ``nfe_*`` / ``tpf_*``), steps,
minutes, seconds per step in rollouts and in the update, seeds) and writes it with the raw summaries to ``--out``.
Runs whose
``summary.json`` exists are not rerun (``--force`` reruns them): the same command fills in missing runs and
reprints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rare_shapes import write_rare_set

from dllm_rl.rl.cli import DEMO_DIR, demo_config_path, demo_overrides, recipe_overrides
from dllm_rl.rl.presets import PRESETS
from dllm_rl.training import METRICS_FILE, read_metrics

# every preset (the methods' modules, dllm_rl.rl.methods) on both Countdown demo models, and the two presets whose
# estimators have a uniform-state form (trajectory, uniform_elbo) on the DiffusionGemma-shaped one
DEFAULT_RUNS = [f"{model}:{m}" for m in PRESETS for model in ("full", "block")] + ["gemma:tracerl", "gemma:espo"]
RARE = Path(__file__).with_name("rare_shapes.py")
DPO_DEMO = Path(__file__).with_name("dpo_demo.py")  # the offline row ``full:dpo``: pairs, dllm-rl dpo, evaluations
# the models whose runs are also scored on the rare Countdown puzzles (``vision`` learns the shapes image task)
COUNTDOWN_MODELS = ("full", "block")
# per-method settings of the demo rows (a method-specific option cannot live in the shared demo configs):
# BGPO's and EBPO's 16 draws (their presets; BGPO's paper's large-sample setting) make an update ~25 s on one CPU
# thread, 4 keep it at ~3-9 s; their memory does not depend on the draws either way (benchmarks/estimator_memory.py)
# (an override replaces the whole options dict, so the preset's other options are carried over from it)
METHOD_EXTRA = {m: [f"estimator_options={json.dumps({**PRESETS[m]['estimator_options'], 'num_mc': 4})}"]
                for m in ("bgpo", "ebpo")}  # EBPO: 16 draws too (DARE's setting)


def rare_command(model_dir: Path | str, model: str, result: Path, data: Path) -> list[str]:
    return [sys.executable, str(RARE), str(model_dir), model, str(result), "--data", str(data)]


def command(model: str, algo: str, seed: int, out: Path, minutes: float, eval_limit: int, extra: list[str],
            steps: int | None = None, recipe: bool = True):
    if algo == "dpo":  # offline preference training (benchmarks/dpo_demo.py): a step budget only (default 60)
        return [sys.executable, str(DPO_DEMO), "--model", model, "--seed", str(seed), "--out", str(out),
                "--eval-limit", str(eval_limit), *(["--steps", str(steps)] if steps else []), *extra]
    # the algorithm's demo recipe (assets/demo/recipes/, as `dllm-rl demo` lays it) unless --plain; it keeps its
    # own budget (the block ESPO recipe averages the weights of steps 80-120) unless --steps is given
    recipe_ovs = recipe_overrides(model, algo) if recipe else []
    # a step budget replaces the time budget: settings compared at equal updates, whatever the machine's speed
    budget = ([f"train.max_steps={steps}", "train.max_time_minutes=null"] if steps
              else [] if recipe_ovs else [f"train.max_time_minutes={minutes}"])
    return [sys.executable, "-m", "dllm_rl", "rl", str(demo_config_path(model)), *demo_overrides(model),
            *recipe_ovs, f"algorithm={algo}", f"run.seed={seed}",
            f"run.output_dir={out}", "run.overwrite=true", *budget, f"eval.limit={eval_limit}", "run.progress=false",
            "log.samples_every=0", *METHOD_EXTRA.get(algo, []), *extra]


def finished_file(model: str) -> str:
    """The file whose presence says a run of ``model`` is done: the rare-shape score, else the RL summary."""
    return "rare_after.json" if model in COUNTDOWN_MODELS else "summary.json"


def step_seconds(metrics: Path) -> tuple[float, float]:
    """Mean seconds per RL step spent in rollouts and in the update: how fast this machine ran the run
    (machines differ by 2x and more, which moves a time budget's step count)."""
    steps = [m for m in read_metrics(metrics) if "time_rollout" in m]
    if not steps:
        return float("nan"), float("nan")
    return (statistics.mean(m["time_rollout"] for m in steps), statistics.mean(m["time_update"] for m in steps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="*", default=DEFAULT_RUNS,
                    help="model:algorithm pairs (model = full | block | vision | gemma)")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1])
    ap.add_argument("--minutes", type=float, default=9.2,
                    help="time budget per run (wall, 1 thread), from the run's start: the evaluation before "
                    "training counts, the one after does not; a run with a demo recipe keeps the recipe's budget")
    ap.add_argument("--steps", type=int, default=None,
                    help="a step budget instead of --minutes: every run trains exactly this many RL steps (the "
                    "machine's speed varies by 20-50%% over a day, which moves a time budget's step count)")
    ap.add_argument("--eval-limit", type=int, default=500)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="rerun runs whose summary.json already exists")
    ap.add_argument("--report", action="store_true", help="start no run: print the table of the finished ones")
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("--plain", action="store_true",
                    help="the demo config without the algorithm's demo recipe (src/dllm_rl/assets/demo/recipes/): "
                    "how the block ESPO rows measured before its recipe shipped ran (benchmarks/LEARNING.md)")
    ap.add_argument("extra", nargs="*", help="key=value overrides for every run")
    args = ap.parse_args()
    out = Path(args.out)
    rare_file = write_rare_set(out / "rare_shapes.jsonl")
    jobs = []
    for model in sorted({spec.split(":")[0] for spec in args.runs} & set(COUNTDOWN_MODELS)):
        ckpt = DEMO_DIR / ("llada-countdown" if model == "full" else "sdar-countdown")  # its own rare-shape accuracy
        jobs.append((model, "(start)", 0, out / f"{model}-start",
                     rare_command(ckpt, model, out / f"{model}-start" / "rare_after.json", rare_file)))
    for spec in args.runs:
        model, algo = spec.split(":")
        for seed in args.seeds:
            run_dir = out / f"{model}-{algo}-seed{seed}"
            rl = command(model, algo, seed, run_dir, args.minutes, args.eval_limit, args.extra, args.steps,
                         recipe=not args.plain)
            final = run_dir / ("model" if algo == "dpo" else "final")  # dllm-rl dpo publishes model/, rl final/
            rare = rare_command(final, model, run_dir / "rare_after.json", rare_file)
            script = f"{shlex.join(rl)} && {shlex.join(rare)}" if model in COUNTDOWN_MODELS else shlex.join(rl)
            jobs.append((model, algo, seed, run_dir, ["sh", "-c", script]))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    running: list[tuple[subprocess.Popen, tuple]] = []
    # finished runs are kept (rerunning the same command only fills in what is missing, then prints the table);
    # a run started again (unfinished, or --force) replaces what its directory held (overwrite=true)
    pending = [] if args.report else [j for j in jobs if args.force or not (j[3] / finished_file(j[0])).is_file()]
    while pending or running:
        while pending and len(running) < args.parallel:
            job = pending.pop(0)
            job[3].mkdir(parents=True, exist_ok=True)
            with open(job[3] / "log.txt", "w") as log:
                proc = subprocess.Popen(job[4], stdout=log, stderr=subprocess.STDOUT, env=env)
            print(f"start {job[0]}:{job[1]} seed {job[2]}", flush=True)
            running.append((proc, job))
        time.sleep(2)
        for proc, job in list(running):
            if proc.poll() is not None:
                running.remove((proc, job))
                print(f"done  {job[0]}:{job[1]} seed {job[2]} (exit {proc.returncode})", flush=True)
    rows = {}
    rare_before = {}
    for model, algo, _seed, run_dir, _ in jobs:
        if algo == "(start)":
            f = run_dir / "rare_after.json"
            rare_before[model] = json.loads(f.read_text())["accuracy"] if f.is_file() else float("nan")
            continue
        f = run_dir / "summary.json"
        if not f.is_file():
            print(f"missing {f} (see {run_dir / 'log.txt'})")
            continue
        s = json.loads(f.read_text())
        s["step_seconds"] = step_seconds(run_dir / METRICS_FILE)
        rare = run_dir / "rare_after.json"
        s["rare_after"] = json.loads(rare.read_text())["accuracy"] if rare.is_file() else float("nan")
        rows.setdefault((algo, model), []).append(s)
    def gain(after: list[float], before: list[float]) -> str:
        gains = [a - b for a, b in zip(after, before)]
        sd = statistics.stdev(gains) if len(gains) > 1 else 0.0
        return f"{statistics.mean(gains) * 100:+.1f} ± {sd * 100:.1f} pts"

    def passes(ss: list[dict]) -> str:
        """Mean held-out passes per answer before -> after, and tokens per forward after (n/a: an older run)."""
        nan = float("nan")
        b, a, t = (statistics.mean(s.get(k, nan) for s in ss) for k in ("nfe_before", "nfe_after", "tpf_after"))
        return f"{b:.1f} -> {a:.1f} ({t:.2f})"

    # with ema_decay the returned model is the weight average; the last live policy's gain is shown beside it
    lines = ["| method | model | before | after (per seed) | gain (mean ± sd) | gain, last live policy | rare shapes: "
             "before -> after (per seed) | passes per answer: before -> after (tokens per forward) | steps | minutes | "
             "s/step rollout + update | seeds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (algo, model), ss in rows.items():
        before = [s["accuracy_before"] for s in ss]
        after = [s["accuracy_after"] for s in ss]
        live = gain([s["accuracy_after_live"] for s in ss], before) if all(
            "accuracy_after_live" in s for s in ss) else "(no average)"
        after_s = " / ".join(f"{a:.1%}" for a in after)
        steps = [s["steps"] for s in ss]
        t_roll, t_upd = (statistics.mean(s["step_seconds"][k] for s in ss) for k in (0, 1))
        r0 = rare_before.get(model, float("nan"))
        rare_s = "(Countdown only)" if model not in COUNTDOWN_MODELS else (
            f"{r0:.1%} -> " + " / ".join(f"{s['rare_after']:.1%}" for s in ss)
            + f" ({(statistics.mean(s['rare_after'] for s in ss) - r0) * 100:+.1f} pts)")
        lines.append(f"| {algo} | {model} | {statistics.mean(before):.1%} | {after_s} | {gain(after, before)} | "
                     f"{live} | {rare_s} | {passes(ss)} | "
                     f"{'-'.join(str(v) for v in sorted({min(steps), max(steps)}))} | "
                     f"{statistics.mean(s['minutes'] for s in ss):.1f} | {t_roll:.2f} + {t_upd:.2f} | {len(ss)} |")
    table = "\n".join(lines)
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    (out / "summaries.json").write_text(json.dumps({f"{a}/{m}": v for (a, m), v in rows.items()}, indent=2))


if __name__ == "__main__":
    main()
