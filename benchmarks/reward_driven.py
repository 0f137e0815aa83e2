"""Does a reward-model-driven run move its reward? RL of a demo model where a reward model is the only reward.

    python benchmarks/reward_driven.py                         # block demo model, seeds 0 1, 30 steps each
    python benchmarks/reward_driven.py --model full --seeds 0 --steps 10

The reward model is a tiny Llama sequence-classification model in the layout of the common open reward models
(``LlamaForSequenceClassification``, head ``score``, a chat template), built here with weights set by hand so that
what it prefers is known: its one attention layer attends uniformly (zero queries), its values read one embedding
direction that only the ``--char`` character has, and its head reads the mean of that direction. The score is
therefore an increasing function of the share of ``--char`` in the conversation (the same prompt within a group,
so the completions' share decides). Each run is `dllm-rl rl` on the demo config with ``reward.model`` set and no
held-out evaluation; the table shows the mean reward-model score of the first and last ``--window`` steps' rollouts
and the share of ``--char`` in their completions (read from the logged samples), per seed. The verifier's
accuracy is not the objective here and is not shown.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from dllm_rl.models import char_tokenizer
from dllm_rl.rl.cli import demo_config_path, demo_overrides
from dllm_rl.training import METRICS_FILE, read_metrics
from dllm_rl.training.run_log import ROLLOUTS_FILE

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"


def build_counting_reward_model(path: Path, char: str) -> Path:
    """A 1-layer Llama reward model whose score rises with the share of ``char`` in the text (module docstring)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = char_tokenizer(chat_template=TEMPLATE)
    target = tok.convert_tokens_to_ids(char)
    if target == tok.unk_token_id:
        raise SystemExit(f"--char {char!r} is not a character of the demo tokenizer")
    conf = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096, num_labels=1,
                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForSequenceClassification(conf)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (model.model.layers[0].input_layernorm, model.model.layers[0].post_attention_layernorm,
                     model.model.norm):
            norm.weight.fill_(1.0)
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 1.0  # every token: a constant direction (keeps the RMS norms away from 0)
        emb[target, 1] = 1.0  # the counted character only
        attn = model.model.layers[0].self_attn  # zero queries: uniform attention over the prefix
        attn.v_proj.weight[0, 1] = 1.0  # value = the counted direction
        attn.o_proj.weight[2, 0] = 1.0  # written to hidden dim 2 (head 0's first value dim)
        model.score.weight[0, 2] = 1.0  # the score reads it after the final norm
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def share(texts: list[str], char: str) -> float:
    chars = sum(len(t) for t in texts)
    return sum(t.count(char) for t in texts) / chars if chars else float("nan")


def run(model: str, rm: Path, seed: int, steps: int, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "dllm_rl", "rl", str(demo_config_path(model)), *demo_overrides(model),
           f"reward.model={rm}", "reward.device=cpu", "reward.dtype=float32", f"run.seed={seed}",
           f"run.output_dir={out}", "run.overwrite=true", f"train.max_steps={steps}", "train.max_time_minutes=null",
           "eval.limit=0", "run.progress=false", "log.samples_every=0", "log.rollouts=64", "log.dashboard=false",
           "run.save_every=0"]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return read_metrics(out / METRICS_FILE)


def samples(out: Path) -> dict[int, list[str]]:
    """The logged completions of each step (``rollouts.jsonl``: step, completion)."""
    by_step: dict[int, list[str]] = {}
    path = out / ROLLOUTS_FILE
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        by_step.setdefault(int(row["step"]), []).append(str(row.get("completion", "")))
    return by_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="block", choices=["block", "full"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--window", type=int, default=5, help="steps averaged at the start and at the end")
    ap.add_argument("--char", default="+", help="the character the reward model prefers")
    ap.add_argument("--out", type=Path, default=Path("runs/reward-driven"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rm = build_counting_reward_model(args.out / "counting-rm", args.char)
    print(f"| model | seed | RM score, first {args.window} steps | last {args.window} | '{args.char}' share first | "
          "last |\n|---|---|---|---|---|---|")
    for seed in args.seeds:
        out = args.out / f"{args.model}-seed{seed}"
        rows = [m for m in run(args.model, rm, seed, args.steps, out) if "reward" in m]
        first, last = rows[:args.window], rows[-args.window:]
        texts = samples(out)
        steps_first, steps_last = [int(m["step"]) for m in first], [int(m["step"]) for m in last]
        print(f"| {args.model} | {seed} | {statistics.mean(m['reward'] for m in first):.4f} | "
              f"{statistics.mean(m['reward'] for m in last):.4f} | "
              f"{share([t for s in steps_first for t in texts.get(s, [])], args.char):.3f} | "
              f"{share([t for s in steps_last for t in texts.get(s, [])], args.char):.3f} |", flush=True)


if __name__ == "__main__":
    main()
