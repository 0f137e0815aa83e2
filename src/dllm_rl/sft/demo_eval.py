"""Held-out accuracy of a (demo) checkpoint on a task: greedy decoding + the task's reward.

    python -m dllm_rl.sft.demo_eval src/dllm_rl/assets/demo/llada-countdown
    python -m dllm_rl.sft.demo_eval src/dllm_rl/assets/demo/sdar-countdown --n 200
    python -m dllm_rl.sft.demo_eval MODEL_DIR --data test.jsonl --task countdown --gen-length 32 --block-length 8

Defaults are the shipped demo models' settings: the 500-puzzle held-out countdown file next to them
(``assets/demo/countdown_heldout.jsonl``, the one ``make demo`` reports), the compact prompt style, greedy
decoding one token per step, low-confidence (probability) order, and the ``gen_length`` / ``block_length`` of
the demo RL config that trains the checkpoint (``assets/demo/rl-*.yaml``): ``llada-countdown`` decodes 16 slots
as one block (its tokenizer spells ``<answer>`` and ``</answer>`` as one token each), ``sdar-countdown`` 32 slots
in its own blocks of 4. Any other checkpoint: gen_length 32, one block of 32.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from dllm_rl.errors import USER_ERRORS

DEMO_DIR = Path(__file__).resolve().parents[1] / "assets" / "demo"
HELDOUT = DEMO_DIR / "countdown_heldout.jsonl"


def decode_lengths(model_dir: str | Path) -> tuple[int, int]:
    """``(gen_length, block_length)`` of the demo RL config whose ``model`` is ``model_dir``; (32, 32) else."""
    import yaml

    for cfg in sorted(DEMO_DIR.glob("rl-*.yaml")):
        data = yaml.safe_load(cfg.read_text())
        if (DEMO_DIR / data["model"]).resolve() == Path(model_dir).resolve():
            return int(data["rollout"]["gen_length"]), int(data["rollout"]["block_length"])
    return 32, 32


def evaluate(
    model_dir: str | Path,
    data: str | Path = HELDOUT,
    task_name: str = "countdown",
    prompt_style: str = "compact",
    n: int | None = None,
    gen_length: int | None = None,
    block_length: int | None = None,
    steps: int | None = None,
    threshold: float | None = None,
    batch_size: int = 100,
    model: Any = None,
    tokenizer: Any = None,
) -> dict[str, Any]:
    """Greedy-decode the task's prompts and score them; returns accuracy, counts, settings and a few samples.

    ``model`` / ``tokenizer`` may be given instead of loading ``model_dir`` (e.g. during training);
    without ``gen_length``, both lengths default to :func:`decode_lengths`; ``block_length`` else to
    ``gen_length``."""
    from dllm_rl.eval.heldout import check_not_empty, heldout_accuracy
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.sampling import DecodeConfig
    from dllm_rl.tasks import get_task

    if gen_length is None:
        gen_length, default_block = decode_lengths(model_dir)
    else:
        default_block = gen_length
    block_length = block_length or default_block
    if model is None:
        model = load_model(model_dir)
    if tokenizer is None:
        tokenizer = load_tokenizer(model_dir, mask_token_id=model.mask_token_id)
    task = get_task(task_name, data=str(data), prompt_style=prompt_style, limit=n)
    check_not_empty(task, "held-out", "--data")
    examples = task.examples
    config = DecodeConfig(gen_length=gen_length, block_length=block_length, steps=steps, threshold=threshold,
                          temperature=0.0)
    t0 = time.perf_counter()
    res = heldout_accuracy(model, tokenizer, task, examples, config, batch_size=batch_size)
    elapsed = time.perf_counter() - t0
    task.close()
    decode_block = model.block_size if model.is_block_causal else block_length
    return {
        "model": str(model_dir), "data": str(data), "task": task_name, "n": res.n,
        "accuracy": res.accuracy, "correct": int(sum(float(s) >= 1.0 for s in res.scores)),
        "decode": {"gen_length": gen_length, "block_length": decode_block, "steps": steps, "threshold": threshold,
                   "temperature": 0.0, "confidence": config.confidence},
        "nfe_mean": res.nfe_mean, "seconds": round(elapsed, 2),
        "samples": [{"prompt": task.build_prompt(ex), "completion": t, "reward": float(s), "reason": s.reason}
                    for ex, t, s in list(zip(examples, res.texts, res.scores))[:5]],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dllm_rl.sft.demo_eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", help="checkpoint directory (published layout + tokenizer)")
    p.add_argument("--data", default=str(HELDOUT), help="held-out task file (default: the shipped countdown file)")
    p.add_argument("--task", default="countdown", help="task whose reward scores the completions")
    p.add_argument("--prompt-style", default="compact", choices=["chat", "plain", "compact"])
    p.add_argument("--n", type=int, default=None, help="evaluate the first N examples (default: all)")
    p.add_argument("--gen-length", type=int, default=None,
                   help="completion slots (default: the demo RL config's for a shipped checkpoint, else 32)")
    p.add_argument("--block-length", type=int, default=None,
                   help="semi-AR block of full-attention models (default: as --gen-length)")
    p.add_argument("--steps", type=int, default=None, help="steps per block (default: one token per step)")
    p.add_argument("--threshold", type=float, default=None, help="dynamic decoding threshold instead of steps")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        res = evaluate(args.model_dir, args.data, args.task, args.prompt_style, args.n, args.gen_length,
                       args.block_length, args.steps, args.threshold, args.batch_size)
    except USER_ERRORS as exc:  # the user's to fix: one line (dllm_rl.errors)
        print(f"demo_eval: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    d = res["decode"]
    for s in res["samples"][:3]:
        print(f"  {s['prompt'].strip()!r} -> {s['completion']!r} ({s['reason']})")
    schedule = f"threshold {d['threshold']}" if d["threshold"] else f"steps/block {d['steps'] or d['block_length']}"
    print(f"{res['model']}: {res['task']} accuracy {res['accuracy']:.3f} ({res['correct']}/{res['n']}) "
          f"greedy, gen_length {d['gen_length']}, block {d['block_length']}, {schedule}, "
          f"{res['nfe_mean']:.1f} NFE, {res['seconds']}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
