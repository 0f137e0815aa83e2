"""One rank of the 2-rank trainer tests (started by ``accelerate launch``; see test_sharded_trainers.py), or the
one-process run they are compared with (started as a plain script).

Under whatever backend the launch configured (DDP, FSDP2, ZeRO), runs in one process group: SFT 2 steps,
SFT 1 step + resume to 2, SFT with LoRA 2 steps, ESPO 2 steps (checkpoint every step), TraceRL 2 steps with
a frozen reference copy (beta > 0), TraceRL with LoRA and the adapter-disabled base as its reference, TraceRL
with its value model 2 steps and resumed from step 1 (the RL checkpoint's resume, the value model's included;
the gathered value weights in ``value_weights.pt``), DPO (VRPO) 2 steps with its frozen reference copy. Each run
writes its final model in the published layout under OUT/<run>/ (``model/`` for SFT, ``final/`` for RL).

ESPO with uneven kept samples (``uneven``; also alone as mode ``uneven``) and ESPO with a NaN loss in step 1
(``nan``) follow ESPO. Mode ``short``: SFT, ESPO, ESPO with the NaN, ESPO resumed and TraceRL with its value model.

Mode ``fault``: the same ESPO run, with a checkpoint after step 1, where rank 1 SIGKILLs itself in the middle
of step 2 (before its first optimizer step there). Mode ``resume``: that run resumed from its latest checkpoint;
``all+resume``: that resume, then the full set.
Mode ``dpo``: the DPO run alone.
Mode ``gemma``: DiffusionGemma's SFT and TraceRL (:func:`gemma`); ``gemma_lora``: the same with LoRA
(:func:`gemma_lora`), each run's gathered adapters and base in OUT/<run>/lora_state.pt.
"""

from __future__ import annotations

import gc
import math
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import torch

from dllm_rl.config import load_config
from dllm_rl.dpo.config import DPOConfig
from dllm_rl.dpo.trainer import train as dpo_train
from dllm_rl.rl import trainer as rl_trainer
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train as rl_train
from dllm_rl.rl.update import PolicyUpdater
from dllm_rl.seeding import derive_seed
from dllm_rl.sft.config import SFTConfig
from dllm_rl.sft.trainer import train as sft_train
from dllm_rl.training.accel import end_distributed
from dllm_rl.training.sharding import full_state_dict


def dense_reward(prompts, completions, **columns):
    """Varies between samples, so no group is dropped and every step updates."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) + sum(map(ord, c)) % 13 / 100 for c in completions]


def uneven_reward(prompts, completions, **columns):
    """:func:`dense_reward`, but one reward for every sample of some prompts: their groups have no variance and
    are dropped, so in some steps one rank keeps samples and the other none (it pads its micro-batches)."""
    dense = dense_reward(prompts, completions)
    return [0.5 if sum(map(ord, p)) % 2 else r for p, r in zip(prompts, dense)]


# The global batch is the same at any world size (2 SFT examples per micro-batch, 2 RL prompts per step),
# so a one-process run (started without a launcher) trains on what 2 ranks train on together.
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


def sft(root: Path, out: Path, *extra: str, family: str = "sdar") -> None:
    args = [f"model.path={root / family}", f"data.train_file={root / 'sft.jsonl'}", "train.max_steps=2",
            f"train.micro_batch_size={2 // WORLD}", "train.grad_accum=2", "train.log_every=1", "run.progress=false",
            "train.mixed_precision=no", "objective.logprob_chunk_size=3",
            "optim.lr=0.003", f"run.output_dir={out}", *extra]
    sft_train(load_config(SFTConfig, None, args), verbose=False)


def dpo(root: Path, out: Path, *extra: str) -> None:
    """VRPO on ``dpo.jsonl``: 2 pairs per micro-batch (chosen and rejected: 4 rows), the reference a sharded copy."""
    args = [f"model.path={root / 'sdar'}", f"data.train_file={root / 'dpo.jsonl'}", "train.max_steps=2",
            f"train.micro_batch_size={2 // WORLD}", "train.grad_accum=2", "train.log_every=1", "run.progress=false",
            "train.mixed_precision=no", "logprob_chunk_size=3", "num_mc=2", "beta=0.5",
            "optim.lr=0.003", f"run.output_dir={out}", *extra]
    dpo_train(load_config(DPOConfig, None, args), verbose=False)


def rl(root: Path, out: Path, family: str, algorithm: str, *extra: str, reward=dense_reward) -> None:
    args = [f"algorithm={algorithm}", f"model.path={root / family}", "data.task=countdown",
            f"data.train_file={root / 'train.jsonl'}",
            "data.prompt_style=compact", f"train.prompts_per_step={2 // WORLD}", "rollout.num_generations=4",
            "rollout.gen_length=8",
            "rollout.block_length=8", "eval.limit=0", "train.max_steps=2", "train.micro_batch_size=2", "optim.lr=0.003",
            "model.device=cpu", "run.progress=false", "model.logprob_chunk_size=3", "log.samples_every=0",
            "run.keep_checkpoints=5", "log.dashboard=false",  # nothing here reads it (tests/rl checks it)
            f"run.output_dir={out}", *extra]
    rl_train(load_config(RLConfig, None, args), reward_fn=reward)


def nan(root: Path, out: Path) -> None:
    """ESPO whose step 1 has a NaN loss in one micro-batch (:func:`nan_in_step_one`)."""
    micro_loss = PolicyUpdater._micro_loss
    nan_in_step_one()
    try:
        rl(root, out / "espo_nan", "sdar", "espo", "estimator_noise=sample")
    finally:
        PolicyUpdater._micro_loss = micro_loss


def uneven(root: Path, out: Path) -> None:
    """ESPO where step 2 keeps one prompt's group (on one rank) and drops the other's, scoring one row per model
    call: the ranks' micro-batches need different numbers of forwards, which FSDP2 / ZeRO-3 must agree on."""
    rl(root, out / "espo_uneven", "sdar", "espo", "estimator_options={max_rows: 1}", reward=uneven_reward)


def nan_in_step_one(seed: int = 0) -> None:
    """In step 1 the loss of the micro-batch holding global sample 0 (the first micro-batch of rank 0, and of
    one process) is NaN: every rank must skip that step (none back-propagates that micro-batch, and a
    DeepSpeed engine must not step at the boundary of the later, finite ones) and train on in step 2 as one
    process does. The run draws masks per sample (``estimator_noise=sample``), so only that micro-batch holds
    the sample's mask seed."""
    target = derive_seed(seed, 0, 0, 0) % (1 << 62)
    micro_loss = PolicyUpdater._micro_loss

    def poisoned(self, loss_fn, sub, *args):
        if self.step_idx != 0 or target not in sub.sample_seeds.tolist():
            return micro_loss(self, loss_fn, sub, *args)

        def nan_loss(*a, **k):
            out = loss_fn(*a, **k)
            return replace(out, loss=out.loss * math.nan)

        # the same registered loss (its kl_level, ...) with a NaN value
        return micro_loss(self, replace(loss_fn, fn=nan_loss), sub, *args)

    PolicyUpdater._micro_loss = poisoned


def die_in_step_two() -> None:
    """Rank 1 is killed (SIGKILL: no clean-up, no message) in the middle of step 2's update."""
    step = PolicyUpdater._optimizer_step

    def optimizer_step(self):
        if self.step_idx == 1 and self.accelerator.process_index == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        step(self)

    PolicyUpdater._optimizer_step = optimizer_step


def save_value_weights() -> None:
    """Each RL run with a value model also writes its final value weights, gathered (a collective on every rank),
    to OUT/<run>/value_weights.pt from rank 0."""
    save_final = rl_trainer.RLTrainer.save_final_model

    def save_final_model(self):
        if self.value is not None:
            state = full_state_dict(self.accelerator, self.value.module)
            if self.is_main:
                torch.save(state, self.out / "value_weights.pt")
        return save_final(self)

    rl_trainer.RLTrainer.save_final_model = save_final_model


VALUE = ("value_model.enabled=true", "loss_type=token", "value_model.micro_batch_size=1")
LORA = ("lora.enabled=true", "lora.r=4")


def gemma(root: Path, out: Path) -> None:
    """DiffusionGemma (uniform-state), whose scorers call its encoder and decoder directly, outside the DDP wrapper:
    SFT with the uniform denoising objective (self-conditioning on every example: its no-grad first pass) and
    TraceRL (the trajectory estimator) with its value model and a frozen reference copy (beta > 0, sharded like the
    policy under FSDP2) on its own rollouts."""
    sft(root, out / "gemma_sft", *GEMMA_SFT, family="diffusion_gemma")
    gemma_tracerl(root, out / "gemma_tracerl", *VALUE, "reference=copy")


GEMMA_SFT = ("objective.name=uniform", "objective.self_conditioning_p=1.0")


def gemma_tracerl(root: Path, out: Path, *extra: str) -> None:
    """TraceRL on DiffusionGemma's own rollouts, 2 steps, beta > 0."""
    args = [f"model.path={root / 'diffusion_gemma'}", "algorithm=tracerl", "data.task=countdown",
            f"data.train_file={root / 'train.jsonl'}", "data.prompt_style=compact",
            f"train.prompts_per_step={2 // WORLD}", "rollout.num_generations=4", "rollout.gen_length=4",
            "rollout.max_denoising_steps=3", "eval.limit=0", "train.max_steps=2", "train.micro_batch_size=2",
            "optim.lr=0.003", "model.device=cpu", "run.progress=false", "log.samples_every=0",
            "log.dashboard=false", f"run.output_dir={out}", "loss_type=token", "beta=0.05", *extra]
    rl_train(load_config(RLConfig, None, args), reward_fn=dense_reward)


def save_lora_state(out: Path) -> None:
    """The LoRA runs of :func:`gemma_lora` also write, from rank 0, OUT/<run>/lora_state.pt: ``state``, the prepared
    model's full state dict as its final model is gathered (named like the HF module: no ``base_model.model.`` /
    ``.base_layer``), ``twins``, how many LoRA layers of rank 0 have a base weight that is another one's (the encoder
    twins), and ``untied``, the LoRA layers of rank 0 whose adapter tensors are not their twin's Parameters."""
    from peft.tuners.lora import LoraLayer

    from dllm_rl.rl import checkpoints
    from dllm_rl.sft import trainer

    def hooked(original, run: str):
        def publishable(accelerator, prepared, dlm):
            first: dict[int, torch.nn.Module] = {}
            twins, untied = 0, []
            for name, module in prepared.named_modules():
                if isinstance(module, LoraLayer):
                    owner = first.setdefault(id(module.get_base_layer().weight), module)
                    twins += owner is not module
                    mine, its = (list(m.lora_A.parameters()) + list(m.lora_B.parameters()) for m in (module, owner))
                    if len(mine) != len(its) or any(p is not q for p, q in zip(mine, its)):
                        untied.append(name)
            state = full_state_dict(accelerator, prepared)
            if accelerator.is_main_process:
                names = {k.split("base_model.model.")[-1].replace(".base_layer.", "."): v for k, v in state.items()}
                torch.save({"state": names, "twins": twins, "untied": untied}, out / run / "lora_state.pt")
            return original(accelerator, prepared, dlm)

        return publishable

    trainer.publishable = hooked(trainer.publishable, "gemma_sft_lora")
    checkpoints.publishable = hooked(checkpoints.publishable, "gemma_tracerl_lora")


def gemma_lora(root: Path, out: Path) -> None:
    """:func:`gemma`'s SFT and TraceRL with LoRA (one adapter for both text stacks: the twins' adapters tied), the
    adapter-disabled base as TraceRL's reference and no value model."""
    save_lora_state(out)
    sft(root, out / "gemma_sft_lora", *GEMMA_SFT, *LORA, family="diffusion_gemma")
    gemma_tracerl(root, out / "gemma_tracerl_lora", "reference=base", *LORA)


# A checkpoint after every step only for the runs whose step-1 checkpoint another run resumes from (or the test
# reads); every other run saves once, at its end (with save_every=1 a 2-step run saved 3 times: steps 1, 2, end).
SAVED = ("run.save_every=1",)


TRACERL_LORA = ("sdar", "tracerl", "beta=0.05", "reference=base", "lora.enabled=true", "lora.r=4")


def main(root: Path, out: Path, mode: str = "all") -> None:
    # DeepSpeed's ZeRO-3 set-up calls gc.collect() in every engine it builds (deepspeed.runtime.zero.utils.
    # defragment), over the ~370k objects the imports leave (measured on 2 busy cores: 1.7 s a call under cProfile,
    # 14 calls in a full ZeRO-3 launch; 0.6 s a call with this freeze). Frozen, those objects are skipped;
    # what the runs create is not frozen.
    gc.freeze()
    save_value_weights()
    if mode == "fault":
        die_in_step_two()
        rl(root, out / "espo_fault", "sdar", "espo", "run.distributed_timeout_s=60", *SAVED)
        return
    if mode == "uneven":
        uneven(root, out)
        return
    if mode == "dpo":
        dpo(root, out / "dpo")
        return
    if mode == "gemma":
        gemma(root, out)
        return
    if mode == "gemma_lora":
        gemma_lora(root, out)
        return
    if mode in ("resume", "all+resume"):  # all+resume: the fault run's resume, then the full set (one launch)
        rl(root, out / "espo_fault", "sdar", "espo", "run.resume=latest", *SAVED)
        if mode == "resume":
            return
    if mode == "short":  # SFT, ESPO and its resume, TraceRL with LoRA, TraceRL's value model
        sft(root, out / "sft")
        rl(root, out / "espo", "sdar", "espo", *SAVED)
        nan(root, out)
        rl(root, out / "espo_resumed", "sdar", "espo", f"run.resume={out / 'espo' / 'checkpoints' / 'step-0000001'}")
        rl(root, out / "tracerl_lora", *TRACERL_LORA)
        rl(root, out / "value", "sdar", "tracerl", *VALUE, *SAVED)
        return
    sft(root, out / "sft")
    sft(root, out / "sft_resumed", "train.stop_after=1")
    sft(root, out / "sft_resumed", "run.resume=auto")
    sft(root, out / "sft_lora", "lora.enabled=true", "lora.r=4")
    rl(root, out / "espo", "sdar", "espo", *SAVED)
    uneven(root, out)
    nan(root, out)
    rl(root, out / "tracerl", "sdar", "tracerl", "beta=0.05", "reference=copy")
    rl(root, out / "tracerl_lora", *TRACERL_LORA)
    rl(root, out / "value", "sdar", "tracerl", *VALUE, *SAVED)
    rl(root, out / "value_resumed", "sdar", "tracerl", *VALUE,
       f"run.resume={out / 'value' / 'checkpoints' / 'step-0000001'}")
    dpo(root, out / "dpo")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:])
    end_distributed()  # as the CLI does: the process group goes after the models, not at interpreter exit
