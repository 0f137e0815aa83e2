"""Does DPO (VRPO) from a shipped demo checkpoint lift its held-out accuracy? Pairs from the checkpoint's own right and
wrong answers on training prompts, ``dllm-rl dpo`` on them, greedy held-out accuracy before and after.

    python benchmarks/dpo_demo.py --model full --seed 0 --out runs/learning/full-dpo-seed0 [key=value ...]

Stages (each a ``dllm-rl`` command, so the benchmark runs what a user runs): ``dllm-rl pairs
configs/demo-pairs.yaml`` (``--prompts`` training prompts x ``--k`` samples at temperature 1, the demo's decoding
lengths, seed ``--seed``), ``dllm-rl dpo
configs/demo-dpo.yaml`` (the pairs, ``run.seed``, ``train.max_steps=--steps``, then the overrides), and the held-out
evaluation of the start and the final model (the demo's greedy decoding, ``--eval-limit`` puzzles). Writes
``summary.json`` (``accuracy_before``, ``accuracy_after``, ``steps``, ``minutes``, ``pairs``) as ``dllm-rl rl`` does,
so ``benchmarks/learning.py`` tabulates its rows (``full:dpo``) with the RL methods'.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def heldout(model_dir: Path, limit: int, demo_model: Path) -> float:
    """Greedy held-out accuracy of a checkpoint with the decoding of ``demo_model`` (the start checkpoint:
    ``dllm-rl eval --demo``'s settings for it; a trained copy outside the demo folder would get the default lengths)."""
    from dllm_rl.eval.demo import demo_defaults
    from dllm_rl.eval.heldout import heldout_accuracy
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.sampling import DecodeConfig
    from dllm_rl.tasks import get_task

    demo = demo_defaults(demo_model, {})
    model = load_model(model_dir)
    tokenizer = load_tokenizer(model_dir, mask_token_id=model.mask_token_id)
    task = get_task(demo["task"], data=demo["data"], split="test", prompt_style=demo["prompt_style"], limit=limit)
    return heldout_accuracy(model, tokenizer, task, list(task), DecodeConfig(**demo["decode"])).accuracy


def main() -> None:
    from dllm_rl.eval.demo import DEMO_DIR, demo_defaults

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["full", "block"], default="full")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=256, help="training prompts sampled for pairs")
    ap.add_argument("--k", type=int, default=8, help="samples per prompt")
    ap.add_argument("--steps", type=int, default=60, help="DPO steps")
    ap.add_argument("--eval-limit", type=int, default=500)
    ap.add_argument("--out", required=True)
    ap.add_argument("extra", nargs="*", help="key=value overrides of the dpo run")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start_model = DEMO_DIR / ("llada-countdown" if args.model == "full" else "sdar-countdown")
    decode = demo_defaults(start_model, {})["decode"]
    t0 = time.time()
    dllm = [sys.executable, "-m", "dllm_rl"]
    pairs = out / "pairs.jsonl"
    if not pairs.is_file():
        subprocess.run([*dllm, "pairs", str(ROOT / "configs" / "demo-pairs.yaml"), f"model.path={start_model}",
                        f"data={DEMO_DIR / 'countdown_train.jsonl'}", f"limit={args.prompts}", f"k={args.k}",
                        f"decode.gen_length={decode['gen_length']}", f"decode.block_length={decode['block_length']}",
                        f"decode.seed={args.seed}", f"out={pairs}"], check=True)
    subprocess.run([*dllm, "dpo", str(ROOT / "configs" / "demo-dpo.yaml"), f"model.path={start_model}",
                    f"data.train_file={pairs}", f"data.pad_response_to={decode['gen_length']}",
                    f"run.output_dir={out}", "run.overwrite=true", "run.progress=false", f"run.seed={args.seed}",
                    f"train.max_steps={args.steps}", *args.extra], check=True)
    minutes = (time.time() - t0) / 60
    summary = {"accuracy_before": heldout(start_model, args.eval_limit, start_model),
               "accuracy_after": heldout(out / "model", args.eval_limit, start_model), "steps": args.steps,
               "minutes": minutes,
               "pairs": sum(1 for _ in pairs.open()), "output_dir": str(out)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
