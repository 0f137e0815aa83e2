"""The SFT trainer: one script from one CPU to many GPUs (``accelerate``).

Loop per optimizer step: ``grad_accum`` micro-batches (``accelerator.no_sync`` on all but the last), each
``loss / grad_accum`` back-propagated; clip; AdamW; scheduler. Exact resume restores weights, optimizer,
scheduler, every RNG and the data position (see :mod:`dllm_rl.training.checkpoint`).

Run directory (``run.output_dir``)::

    config.yaml            resolved config            metrics.jsonl   one JSON object per logged step
    data_report.json       rows read / kept / dropped  checkpoints/step-NNNNNNN/   periodic + final checkpoints
    model/                 the final model in the family's published layout (LoRA merged) + tokenizer
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import DistributedDataParallelKwargs

from dllm_rl.config import ConfigError, save_config, to_dict
from dllm_rl.hub import push_to_hub
from dllm_rl.models.image_inputs import PromptEncoder, copy_vq
from dllm_rl.models.moe import freeze_routers, router_stats
from dllm_rl.seeding import derive_seed
from dllm_rl.sft.config import SFTConfig
from dllm_rl.sft.data import DataReport, SFTExample, collate, encode_images, load_sft_data
from dllm_rl.sft.model_build import build_tokenizer_and_model
from dllm_rl.sft.objectives import check_objective, compute_objective
from dllm_rl.threads import use_cpu_threads
from dllm_rl.training import (
    IndexStream,
    MetricsLogger,
    Progress,
    apply_lora,
    build_optimizer,
    build_scheduler,
    checkpoint_name,
    has_lora,
    load_checkpoint,
    make_accelerator,
    merged_model,
    prune_checkpoints,
    save_checkpoint,
)
from dllm_rl.training.accel import PreparedModel, training_device
from dllm_rl.training.backend import backward, clip_gradients, micro_step, publishable, setup_backend
from dllm_rl.training.checkpoint import save_published
from dllm_rl.training.finite import Guarded, WeightGuard
from dllm_rl.training.ranks import forward_agreement
from dllm_rl.training.resume_check import SFT_APPLICABLE, check_resumed_config
from dllm_rl.training.run_config import resume_checkpoint
from dllm_rl.training.run_dir import SFT_RUN_FILES, interrupted, open_run_dir
from dllm_rl.training.sharding import backend_name
from dllm_rl.training.user_paths import expand_user

MASK_STREAM = 1_000_003  # names the masks' stream in derive_seed(seed, MASK_STREAM)
SFT_PATHS = ("model.path", "model.tokenizer", "data.train_file", "run.output_dir", "run.resume")  # ~ expanded


@dataclass
class SFTResult:
    output_dir: Path
    step: int
    model_dir: Path | None
    last_loss: float | None
    tokens_per_s: float
    data_report: DataReport


class SFTTrainer:
    """Set-up and loop of one SFT run; :func:`train` is ``SFTTrainer(cfg).run()``.

    Other offline trainers (``dllm-rl dpo``) subclass it and change only its seams: :meth:`load_examples`,
    :meth:`before_prepare` / :meth:`after_prepare` (extra models), :meth:`next_micro_batch` and
    :meth:`micro_loss`; the loop, accelerate, checkpoints, resume, LoRA and logs stay this class's."""

    name = "sft"  # the command: messages' prefix, the progress bar
    applicable = SFT_APPLICABLE  # settings that may change on resume
    trains_vision = True  # model.train_vision may put LLaDA-V's projector / tower in the graph

    def __init__(self, cfg: SFTConfig, verbose: bool = True):
        self.cfg = cfg = expand_user(cfg, SFT_PATHS)
        self.verbose = verbose
        t = cfg.train
        self.out = Path(cfg.run.output_dir)
        # DDP without a buffer broadcast per forward (the only buffers are the rotary tables, equal on every
        # rank): a rank whose micro-batch needs a different number of forwards cannot stall the others there.
        self.accelerator = make_accelerator(
            t.mixed_precision, cpu=training_device(cfg.model.device, "model.device"),
            timeout_s=cfg.run.distributed_timeout_s,
            kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])
        acc = self.accelerator
        setup_backend(acc, t.micro_batch_size, cfg.optim.max_grad_norm)
        self.objective_options = self.objective_settings()
        # refused (a file, another run's, an old run without resume/overwrite), locked and cleaned before compute
        self.run_dir = open_run_dir(
            self.out, SFT_RUN_FILES, resume=cfg.run.resume is not None, overwrite=cfg.run.overwrite,
            inputs={"model.path": cfg.model.path, "model.tokenizer": cfg.model.tokenizer,
                    "data.train_file": cfg.data.train_file},
        ) if acc.is_main_process else None
        try:
            if acc.is_main_process:
                self._check_resumed_config()
            acc.wait_for_everyone()
            self._build()
        except BaseException:
            self.close()
            raise

    def objective_settings(self) -> dict[str, Any]:
        """The options :meth:`micro_loss` passes to the objective."""
        return {**self.cfg.objective.options(), "logprob_chunk_size": self.cfg.objective.logprob_chunk_size}

    def load_examples(self) -> tuple[list[Any], DataReport]:
        """The run's examples (each with ``num_tokens`` and ``where``) and their data report."""
        cfg = self.cfg
        check_objective(cfg.objective.name, self.dlm.family)
        backend = backend_name(self.accelerator)
        if self.dlm.family.noise == "uniform" and backend not in ("single", "ddp", "fsdp2"):
            raise ConfigError(f"objective.name={cfg.objective.name}: a {self.dlm.family.name} model trains in one "
                              f"process, under DDP or FSDP2, not {backend} (its scorers call the encoder and "
                              "decoder directly); launch with configs/accelerate/ddp.yaml or fsdp2.yaml")
        examples, report = load_sft_data(
            cfg.data, self.tokenizer, self.dlm.eos_token_id, verbose=self.verbose and self.accelerator.is_main_process)
        if cfg.objective.name == "trace" and any(e.step_map is None for e in examples):
            bad = next(e for e in examples if e.step_map is None)
            raise ValueError(
                f"{bad.where}: the trace objective needs a {cfg.data.step_map_field!r} column in every row")
        return examples, report

    def before_prepare(self) -> None:
        """After the model (and its LoRA) is built, before accelerate prepares it: nothing for SFT."""

    def after_prepare(self) -> None:
        """After accelerate prepared the model and optimizer: nothing for SFT."""

    def _build(self) -> None:
        cfg, t, acc, verbose = self.cfg, self.cfg.train, self.accelerator, self.verbose
        if cfg.model.train_vision != "none" and not self.trains_vision:
            raise ConfigError(f"model.train_vision={cfg.model.train_vision}: dllm-rl {self.name} keeps LLaDA-V's image "
                              "parts as data (its reference scores the policy's image features); set none")
        self.tokenizer, self.dlm = build_tokenizer_and_model(cfg.model, seed=cfg.run.seed, device=acc.device)
        if cfg.model.train_vision != "none":
            if self.dlm.family.name != "llada_v":
                raise ConfigError(f"model.train_vision={cfg.model.train_vision}: for llada_v models only (a "
                                  f"{self.dlm.family.name} model has no vision tower or projector); set none")
            if cfg.lora.enabled:
                raise ConfigError(f"model.train_vision={cfg.model.train_vision}: LoRA adapts the language model only "
                                  "(the image parts would not train); set none or lora.enabled=false")
        if cfg.lora.enabled:
            apply_lora(self.dlm, cfg.lora, seed=cfg.run.seed)
        if cfg.model.freeze_router:
            freeze_routers(self.dlm)
        if cfg.model.gradient_checkpointing:
            self.dlm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.dlm.to(acc.device)
        use_cpu_threads(acc.device, cfg.train.num_threads)
        self.dlm.train()
        self.examples, self.report = self.load_examples()
        # image rows (MMaDA's VQ: model.path's); LLaDA-V's features keep the graph into the parts that train
        self.prompts = PromptEncoder(self.tokenizer, cfg.model.path, train_vision=cfg.model.train_vision)
        too_long = [e for e in self.examples if e.num_tokens > self.dlm.max_length]
        if too_long:
            raise ValueError(f"{too_long[0].where}: {too_long[0].num_tokens} tokens exceed the model's context "
                             f"{self.dlm.max_length}; lower data.max_length")
        world = acc.num_processes
        self.global_micro = t.micro_batch_size * world
        per_step = self.global_micro * t.grad_accum
        if t.num_epochs is not None:
            self.max_steps = max(1, math.ceil(t.num_epochs * len(self.examples) / per_step))
        else:
            self.max_steps = t.max_steps
        self.optimizer = build_optimizer(self.dlm, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, self.max_steps)
        self.before_prepare()
        # one prepare call: under FSDP2 accelerate re-points the optimizer at the sharded parameters
        prepared, self.optimizer = acc.prepare(self.dlm, self.optimizer)
        self.model = PreparedModel(prepared, self.dlm)
        self.after_prepare()
        self.weight_guard = WeightGuard(acc, {"model": Guarded(prepared, "optim.lr", cfg.optim.lr)},
                                        stopping=f"{self.name}: stopping", output="model/")
        self.stream = IndexStream(len(self.examples), seed=cfg.run.seed)
        self.step = 0
        self.tokens_seen = 0  # real tokens through the model over the whole run (all ranks)
        resume_from = self._resume_dir()
        if resume_from is not None:
            state = load_checkpoint(resume_from, self.dlm, optimizer=self.optimizer, scheduler=self.scheduler,
                                    accelerator=acc)
            self.step = state.step
            self.stream.load_state_dict(state.data_state["stream"])
            self.tokens_seen = int(state.extra.get("tokens", 0))
            if verbose and acc.is_main_process:
                print(f"{self.name}: resumed from {resume_from} at step {self.step}")
        if acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out / "config.yaml")
            (self.out / "data_report.json").write_text(json.dumps(self.report.to_dict(), indent=2) + "\n")
        self.logger = MetricsLogger(self.out / "metrics.jsonl", resume_step=self.step if resume_from else None,
                                    enabled=acc.is_main_process, report_to=cfg.run.report_to, config=to_dict(cfg))

    def _check_resumed_config(self) -> None:
        """A resume's config against its checkpoint's, before any compute (:mod:`dllm_rl.training.resume_check`)."""
        path = self._resume_dir()
        applied = check_resumed_config(path, self.cfg, self.applicable) \
            if path is not None else []
        if applied:
            print(f"{self.name}: resume: applied changed settings: {'; '.join(applied)}")

    def _resume_dir(self) -> Path | None:
        return resume_checkpoint(self.cfg.run, self.out)

    # ------------------------------------------------------------------------------------------
    def next_micro_batch(self) -> tuple[list[SFTExample], Any]:
        """This rank's share of the next global micro-batch (every rank advances the stream alike).

        Each example's masks come from its position in the run's example stream (``sample_seeds``), so they
        depend neither on the rank nor on the world size: one process with ``world x micro_batch_size`` examples
        per micro-batch draws the masks the ranks draw together, and a resumed run draws those of an
        uninterrupted one (the stream's position is in the checkpoint)."""
        first = self.stream.consumed
        idx = self.stream.take(self.global_micro)
        bs, rank, seed = self.cfg.train.micro_batch_size, self.accelerator.process_index, self.cfg.run.seed
        mine = [self.examples[i] for i in idx[rank * bs : (rank + 1) * bs]]
        # image rows: the images put in for this model (LLaDA-V's features, MMaDA's codes), once per micro-batch
        mine, images = encode_images(mine, self.prompts, self.dlm)
        batch = collate(mine, self.dlm.pad_token_id, images)
        batch.sample_seeds = torch.tensor([derive_seed(seed, first + rank * bs + i) % (1 << 62)
                                           for i in range(len(mine))], dtype=torch.long)
        return mine, batch

    def mask_generator(self) -> torch.Generator:
        """The generator every micro-batch's masks are drawn from (the same for all: the examples' own
        ``sample_seeds`` make their masks differ)."""
        return torch.Generator().manual_seed(derive_seed(self.cfg.run.seed, MASK_STREAM))

    def micro_loss(self, batch: Any) -> tuple[torch.Tensor, int, dict[str, float]]:
        """One micro-batch's loss (to back-propagate), scored tokens and extra metrics (averaged over the step)."""
        out = compute_objective(self.cfg.objective.name, self.model, batch, self.mask_generator(),
                                agree_calls=forward_agreement(self.accelerator), **self.objective_options)
        return out.loss, out.scored_tokens, out.metrics

    def train_step(self) -> dict[str, float]:
        """One optimizer step over ``grad_accum`` micro-batches; returns this rank's metrics."""
        acc, cfg = self.accelerator, self.cfg
        accum = cfg.train.grad_accum
        total_loss, tokens, scored = 0.0, 0, 0
        extra: dict[str, float] = {}
        for micro in range(accum):
            _, batch = self.next_micro_batch()
            tokens += int(batch.valid().sum().item())
            ctx = micro_step(acc, self.model.prepared, micro == accum - 1)
            with ctx:
                loss, n_scored, more = self.micro_loss(batch)
                backward(acc, self.model.prepared, loss / accum)
            total_loss += float(loss.detach()) / accum
            scored += n_scored
            for k, v in more.items():
                extra[k] = extra.get(k, 0.0) + v / accum
        grad_norm = None
        self.weight_guard.before()
        if cfg.optim.max_grad_norm is not None:
            grad_norm = clip_gradients(acc, self.model.prepared, cfg.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.weight_guard.check(self.step)  # NaN/inf, exploded or collapsed weights: before any checkpoint holds them
        metrics = {"loss": total_loss, "tokens": tokens, "scored_tokens": scored,
                   "lr": self.scheduler.get_last_lr()[0], **extra}
        if grad_norm is not None:
            metrics["grad_norm"] = float(grad_norm)
        if self.dlm.family.moe:  # router load and entropy over the last micro-batch's real tokens
            dev = self.accelerator.device
            metrics.update(router_stats(self.dlm, batch.input_ids().to(dev), batch.valid().to(dev)))
        return metrics

    def save(self) -> Path:
        path = self.out / "checkpoints" / checkpoint_name(self.step)
        save_checkpoint(path, self.dlm, optimizer=self.optimizer, scheduler=self.scheduler, step=self.step,
                        data_state={"stream": self.stream.state_dict()},
                        extra={"tokens": self.tokens_seen},
                        tokenizer=self.tokenizer, config=self.cfg, accelerator=self.accelerator,
                        prepared=self.model.prepared)
        if self.accelerator.is_main_process:
            prune_checkpoints(self.out, self.cfg.run.keep_checkpoints)
            self.run_dir.record()
        return path

    def close(self) -> None:
        """Finish the trackers and release the run directory (its lock) for another run."""
        if getattr(self, "logger", None) is not None:
            self.logger.close()
        if self.run_dir is not None:
            self.run_dir.close()

    def save_final_model(self) -> Path:
        path = self.out / "model"
        plain = publishable(self.accelerator, self.model.prepared, self.dlm)  # collective when sharded
        if self.accelerator.is_main_process:
            model = merged_model(plain) if has_lora(plain) else plain
            save_published(model, path, tokenizer=self.tokenizer)
            copy_vq(self.cfg.model.path, path)  # MMaDA: the image tokenizer travels with the model
            if self.cfg.run.push_to_hub:  # run.push_to_hub: upload model/ to that hub repository
                print(f"{self.name}: pushed {path} to {push_to_hub(path, self.cfg.run.push_to_hub)}")
        self.accelerator.wait_for_everyone()
        return path

    def run(self) -> SFTResult:
        acc, t = self.accelerator, self.cfg.train
        end = self.max_steps if t.stop_after is None else min(self.max_steps, t.stop_after)
        main = acc.is_main_process
        bar = Progress(total=self.max_steps, initial=self.step, desc=self.name,
                       disable=not (self.cfg.run.progress and main))
        window_loss, window_n, last_loss, tps = 0.0, 0, None, 0.0
        start = time.perf_counter()
        while self.step < end:
            m = self.train_step()
            window_loss += m["loss"]
            window_n += 1
            self.tokens_seen += m["tokens"] * acc.num_processes
            tps = bar.update(1, tokens=m["tokens"] * acc.num_processes, loss=m["loss"], lr=m["lr"])
            if self.step % max(t.log_every, 1) == 0 or self.step == end:
                loss = acc.reduce(torch.tensor(window_loss / window_n, device=acc.device), reduction="mean")
                last_loss = float(loss)
                row = {"loss": last_loss, "lr": m["lr"], "tokens_per_s": tps, "epoch": self.stream.epoch_float,
                       "tokens": self.tokens_seen, "elapsed_s": time.perf_counter() - start}
                row.update({k: v for k, v in m.items() if k not in ("loss", "lr", "tokens", "scored_tokens")})
                self.logger.log(self.step, **row)
                window_loss, window_n = 0.0, 0
            if self.cfg.run.save_every and self.step % self.cfg.run.save_every == 0 and self.step < end:
                self.save()
        bar.close()
        self.save()
        model_dir = self.save_final_model() if self.step >= self.max_steps else None
        if main and self.verbose:
            print(f"{self.name}: step {self.step}/{self.max_steps}, loss {last_loss}, {tps:.0f} tokens/s; "
                  f"run in {self.out}" + (f"; model in {model_dir}" if model_dir else ""))
        self.close()
        return SFTResult(self.out, self.step, model_dir, last_loss, tps, self.report)


def train(cfg: SFTConfig, verbose: bool = True) -> SFTResult:
    """Run SFT as configured (see :class:`SFTConfig`)."""
    return run(SFTTrainer(cfg, verbose=verbose))


def run(trainer: SFTTrainer) -> SFTResult:
    """The run of a built trainer (what :func:`train` and ``dllm_rl.SFTTrainer.train`` do); the trainer is closed after
    it."""
    try:  # the run directory's lock is released however the run ends
        return trainer.run()
    except KeyboardInterrupt:  # Ctrl-C: one line naming the step and how to go on (dllm_rl.cli prints it)
        raise interrupted(trainer.out, trainer.step, trainer.max_steps, "run.resume=latest",
                          "run.overwrite=true") from None
    finally:
        trainer.close()
