"""One rank of the 2-rank trainer test (started by ``accelerate launch``; see test_sharded_trainers.py).

Under whatever backend the launch configured (DDP, FSDP2, ZeRO), runs in one process group: SFT 2 steps,
SFT 1 step + resume to 2, SFT with LoRA 2 steps, ESPO 2 steps (checkpoint every step), ESPO resumed from
its step-1 checkpoint, TraceRL 2 steps with a frozen reference copy (beta > 0). Each run writes its final
model in the published layout under OUT/<run>/ (``model/`` for SFT, ``final/`` for RL).
"""

from __future__ import annotations

import sys
from pathlib import Path

from dllm_rl.config import load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.trainer import train as rl_train
from dllm_rl.sft.trainer import SFTConfig
from dllm_rl.sft.trainer import train as sft_train


def dense_reward(prompts, completions, **columns):
    """Varies between samples, so no group is dropped and every step updates."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) + sum(map(ord, c)) % 13 / 100 for c in completions]


def sft(root: Path, out: Path, *extra: str) -> None:
    args = [f"model.path={root / 'sdar'}", f"data.train_file={root / 'sft.jsonl'}", "train.max_steps=2",
            "train.batch_size=2", "train.log_every=1", "train.progress=false", "train.mixed_precision=no",
            "optim.lr=0.01", f"train.output_dir={out}", *extra]
    sft_train(load_config(SFTConfig, None, args), verbose=False)


def rl(root: Path, out: Path, family: str, algorithm: str, *extra: str) -> None:
    args = [f"algorithm={algorithm}", f"model={root / family}", "task=countdown", f"train_data={root / 'train.jsonl'}",
            "prompt_style=compact", "prompts_per_step=1", "num_generations=4", "rollout.gen_length=8",
            "rollout.block_length=8", "eval.limit=0", "max_steps=2", "micro_batch_size=2", "optim.lr=0.003",
            "device=cpu", "progress=false", "log_samples_every=0", "save_every=1", "keep_checkpoints=5",
            f"output_dir={out}", *extra]
    rl_train(load_config(RLConfig, None, args), reward_fn=dense_reward)


def main(root: Path, out: Path) -> None:
    sft(root, out / "sft")
    sft(root, out / "sft_resumed", "train.stop_after=1")
    sft(root, out / "sft_resumed", "train.resume=auto")
    sft(root, out / "sft_lora", "lora.enabled=true", "lora.r=4")
    rl(root, out / "espo", "sdar", "espo")
    rl(root, out / "espo_resumed", "sdar", "espo", f"resume={out / 'espo' / 'checkpoints' / 'step-0000001'}")
    rl(root, out / "tracerl", "sdar", "tracerl", "beta=0.05", "reference=copy")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
