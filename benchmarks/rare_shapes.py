"""The rare-shape held-out set of the learning benchmark: demo-shaped Countdown puzzles in neither demo file.

    python benchmarks/rare_shapes.py MODEL_DIR {full|block} OUT.json [--data FILE] [--limit N]

The demo's training file (6,000 puzzles) and held-out file (500) together hold most of the ~7,650 distinct
puzzles of the demo's shape (3 numbers in 1..20, target in 1..20); the puzzles left over are the shapes the
training draw rarely produced. :func:`write_rare_set` draws them with the same generator, excluding both
files; :func:`rare_accuracy` is the greedy held-out accuracy of a checkpoint on them, decoded exactly as the
demo's held-out evaluation (same task, prompt style, window and schedule) by :func:`demo_decode`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dllm_rl.config import load_config
from dllm_rl.eval.heldout import HeldOut, heldout_accuracy
from dllm_rl.jsonl import read_jsonl, write_jsonl
from dllm_rl.models import load_model, load_tokenizer
from dllm_rl.rl.algorithms import resolve
from dllm_rl.rl.cli import DEMO_DIR, demo_config_path, demo_overrides
from dllm_rl.rl.config import RLConfig, decode_config
from dllm_rl.tasks import get_task
from dllm_rl.tasks.synthetic import make_countdown, row_key


def write_rare_set(path: Path, n: int = 300) -> Path:
    """Write (once) ``n`` demo-shaped puzzles that neither demo data file contains; returns ``path``."""
    if path.is_file():
        return path
    seen = [row_key("countdown", r) for name in ("countdown_train.jsonl", "countdown_heldout.jsonl")
            for r in read_jsonl(DEMO_DIR / name)]
    rows = make_countdown(n, seed=0, numbers=3, max_value=20, split="rare", exclude=seen)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(path, rows)
    return path


def demo_decode(model_dir: str, kind: str, data: Path, limit: int | None = None) -> HeldOut:
    """``model_dir``'s greedy answers to the Countdown puzzles of ``data`` (texts, scores, accuracy), decoded
    with the ``kind`` demo's held-out decoding."""
    cfg = resolve(load_config(RLConfig, demo_config_path(kind), demo_overrides(kind)), kind)
    model = load_model(model_dir, dtype="float32", device="cpu")
    tok = load_tokenizer(model_dir, mask_token_id=model.mask_token_id)
    task = get_task("countdown", data=str(data), split="test", prompt_style=cfg.data.prompt_style, limit=limit)
    return heldout_accuracy(model, tok, task, task.examples, decode_config(cfg, model, evaluation=True),
                            batch_size=cfg.rollout.batch_size, seed=cfg.run.seed)


def rare_accuracy(model_dir: str, kind: str, data: Path, limit: int | None = None) -> dict:
    """Greedy accuracy of ``model_dir`` on ``data`` with the ``kind`` demo's held-out decoding."""
    res = demo_decode(model_dir, kind, data, limit)
    return {"accuracy": res.accuracy, "n": res.n, "model": model_dir}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("kind", choices=("full", "block"))
    ap.add_argument("out")
    ap.add_argument("--data", default=None, help="the rare-shape file (default: written next to OUT)")
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    out = Path(args.out)
    data = Path(args.data) if args.data else write_rare_set(out.parent / "rare_shapes.jsonl")
    out.write_text(json.dumps(rare_accuracy(args.model_dir, args.kind, data, args.limit)) + "\n")


if __name__ == "__main__":
    main()
