"""TraceRL's diffusion value model (arXiv 2509.06949): a backbone of the policy's family with a scalar head.

:class:`ValueModel` reads one value per completion token at the masked state in which that token was committed:
the rows of the trace estimator's planner (:func:`dllm_rl.estimators.plan_trace`, same merged steps and the
batch's layout block), forwarded through the backbone with the prompts' image features spliced in as the
policy's scoring does (LLaDA-V; MMaDA's image codes are prompt ids), the value read at the column whose logits the
trace estimator scores (for block models the token's noisy copy in the two-stream layout: one forward per merged block
step). The head is a bias-free linear
layer initialised to exactly zero (as the published value model), so every value starts at 0. A uniform-state
family (DiffusionGemma) has no masked states: its values are read per accepted draw at each step's canvas
(:mod:`dllm_rl.rl.value_uniform`); :func:`value_reading` is the one place that picks the reading.

:class:`ValueLearner` is what the RL trainer calls, at three points of a step: :meth:`ValueLearner.values` after
the rollout (the values before any update), :meth:`ValueLearner.advantages` (returns and GAE token advantages,
:mod:`dllm_rl.rl.returns`), and :meth:`ValueLearner.update` after the policy update (the clipped value loss, its
own AdamW); plus :meth:`ValueLearner.checkpoint_files` / :meth:`ValueLearner.load` with the checkpoints. The
policy therefore uses the values from before the value update, the paper's order. Under FSDP2 / DeepSpeed the
value model is sharded like the policy (prepared by the same accelerator; its shards ride in the checkpoint's
``accelerator.save_state``), and every micro-batch step goes through the backend's
:func:`~dllm_rl.training.backend.micro_step`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dllm_rl.config import ConfigError
from dllm_rl.estimators import ScoringBatch, merged_steps, plan_rows
from dllm_rl.estimators.scoring import row_inputs
from dllm_rl.estimators.trace import decoding_order
from dllm_rl.models import DiffusionLM, detect_family, load_model
from dllm_rl.models.diffusion_lm import EmbedSplice, embeddings_spliced
from dllm_rl.models.loading import read_config
from dllm_rl.models.masks import position_ids_from_valid
from dllm_rl.rl.returns import (
    clipped_value_loss,
    outcome_step_rewards,
    process_step_rewards,
    step_ranks,
    token_returns_advantages,
    whiten,
)
from dllm_rl.rl.value_uniform import idle_uniform_value, uniform_step_ranks, uniform_value_chunks, valued_columns
from dllm_rl.sampling.uniform import CanvasContext
from dllm_rl.training import apply_lora, build_optimizer, merged_model
from dllm_rl.training.backend import backward, clip_gradients, deepspeed_clipping, is_sharded, micro_step
from dllm_rl.training.disk_full import torch_save
from dllm_rl.training.ranks import micro_batches, sum_over_ranks

STATE_FILE = "value_model.pt"


class ValueModel(nn.Module):
    """A :class:`DiffusionLM` backbone and a zero-initialised ``hidden -> 1`` head (no bias)."""

    def __init__(self, backbone: DiffusionLM):
        super().__init__()
        self.backbone = backbone
        hidden = int(backbone.config.hidden_size)
        self.head = nn.Linear(hidden, 1, bias=False, device=backbone.device, dtype=backbone.dtype)
        nn.init.zeros_(self.head.weight)
        # The LM head takes no part in the value: frozen, so that it neither trains nor waits for a gradient
        # (DDP would wait for it); a head tied to the input embeddings stays trainable through them.
        lm_head = backbone.hf_model.get_output_embeddings()
        if lm_head is not None and not bool(getattr(backbone.config, "tie_word_embeddings", False)):
            lm_head.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attn_bias: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, splice: EmbedSplice | None = None, *,
                context: CanvasContext | None = None) -> torch.Tensor:
        """``[R, T]`` float32 values at every input column (the last hidden state through the head); ``splice``: the
        prompts' image features (LLaDA-V), put where the policy's forward puts them. ``context``: a uniform-state
        family's encoder cache, against which the decoder reads the canvas ``input_ids`` (without self-conditioning,
        :mod:`dllm_rl.rl.value_uniform`)."""
        if context is not None:
            return self.head(context.hidden(input_ids)).squeeze(-1).float()
        embedding = self.backbone.causal_lm.get_input_embeddings()
        with embeddings_spliced(embedding, splice):
            out = self.backbone.model(input_ids=input_ids, attention_mask=attn_bias.to(self.backbone.dtype),
                                      position_ids=position_ids, output_hidden_states=True, logits_to_keep=1)
        return self.head(out.hidden_states[-1]).squeeze(-1).float()


def token_values(module: nn.Module, backbone: DiffusionLM, batch: ScoringBatch, shrinkage: int) -> torch.Tensor:
    """``[B, G]`` float32: the value of each counted completion token at the state in which it was committed
    (0 elsewhere). ``module`` is the :class:`ValueModel` (or its distributed wrapper), ``backbone`` its plain
    backbone (its family, block size and mask id plan the rows). Differentiable when called under grad."""
    rows = plan_rows(backbone, "trace", batch, None, shrinkage=shrinkage)
    device = backbone.device
    out = torch.zeros(batch.batch_size, batch.completion_len, dtype=torch.float32, device=device)
    live = torch.nonzero(rows.weight.ne(0).any(-1), as_tuple=True)[0]
    if live.numel() == 0:  # still one forward, as a rank with something to value makes (FSDP2 / ZeRO-3 gather)
        return out + one_token_values(module, backbone).sum() * 0.0
    inputs, col = row_inputs(backbone, rows, live, device)
    if "attn_bias" not in inputs:  # plain rows: the family's own attention rule
        valid = inputs["attention_mask"].bool()
        pos = position_ids_from_valid(valid)
        inputs = {**inputs, "attn_bias": backbone.default_bias(valid, pos, rows.block_size), "position_ids": pos}
    # the rows' image features (LLaDA-V; MMaDA's images are prompt ids already): the value sees what the policy saw
    values = module(inputs["input_ids"], inputs["attn_bias"], inputs["position_ids"], inputs.get("splice"))
    rr, gg = torch.nonzero(rows.weight[live].to(device).ne(0), as_tuple=True)
    picked = values[rr, col[rr, gg]]
    return out.index_put((rows.sample[live].to(device)[rr], gg), picked)


def one_token_values(module: nn.Module, backbone: DiffusionLM) -> torch.Tensor:
    """The value model on one mask token: the forward a rank with nothing to value makes, so that every rank
    runs as many (each gathers the shards under FSDP2 / ZeRO-3)."""
    ids = torch.full((1, 1), backbone.mask_token_id, dtype=torch.long, device=backbone.device)
    bias = torch.zeros(1, 1, 1, 1, dtype=backbone.dtype, device=ids.device)
    return module(ids, bias, torch.zeros_like(ids))


class MaskedReading:
    """The values of a masked family: one per completion token (``[B, G]``), read at its commit state by
    :func:`token_values`; its steps are the trace estimator's merged decoding steps."""

    def __init__(self, backbone: DiffusionLM, shrinkage: int):
        self.backbone, self.shrinkage = backbone, shrinkage

    def width(self, batch: ScoringBatch) -> int:
        return batch.completion_len

    def chunks(self, module: nn.Module, batch: ScoringBatch, grad: bool
               ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        yield token_values(module, self.backbone, batch, self.shrinkage), None  # None: every column at once

    def _ranks(self, batch: ScoringBatch, shrinkage: int) -> tuple[torch.Tensor, torch.Tensor]:
        merged, blk = merged_steps(batch, shrinkage, self.backbone.layout_block(batch.block_size))
        counted = (merged >= 0) & batch.completion_mask.to(merged.device)
        return step_ranks(decoding_order(merged, blk), counted)

    def ranks(self, batch: ScoringBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self._ranks(batch, self.shrinkage)

    def decoding_ranks(self, batch: ScoringBatch) -> torch.Tensor:
        """Each token's decoding step before merging (process rewards come per decoding step)."""
        return self._ranks(batch, 1)[0]

    def idle(self, module: nn.Module) -> torch.Tensor:
        return one_token_values(module, self.backbone)


class UniformReading:
    """The values of a uniform-state family (:mod:`dllm_rl.rl.value_uniform`): one per accepted draw of a counted
    step (``[B, S * G]``, the trajectory estimator's columns), read at the step's canvas; its steps are the counted
    steps; under grad ``chunk`` steps at a time."""

    def __init__(self, backbone: DiffusionLM, chunk: int):
        self.backbone, self.chunk = backbone, chunk

    def width(self, batch: ScoringBatch) -> int:
        return valued_columns(batch).shape[1]

    def chunks(self, module: nn.Module, batch: ScoringBatch, grad: bool
               ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        return uniform_value_chunks(module, self.backbone, batch, self.chunk if grad else None)

    def ranks(self, batch: ScoringBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return uniform_step_ranks(batch)

    def decoding_ranks(self, batch: ScoringBatch) -> torch.Tensor:
        return uniform_step_ranks(batch)[0]

    def idle(self, module: nn.Module) -> torch.Tensor:
        return idle_uniform_value(module, self.backbone)


def value_reading(backbone: DiffusionLM, vcfg, shrinkage: int) -> MaskedReading | UniformReading:
    """Where the values of ``backbone``'s family are read: the one place that tells masked from uniform-state
    noise (the family's ``noise``)."""
    if backbone.family.noise == "uniform":
        return UniformReading(backbone, vcfg.step_chunk_size)
    return MaskedReading(backbone, shrinkage)


def _with_last(items: Iterator) -> Iterator[tuple[Any, bool]]:
    """``(item, is_last)`` over ``items``."""
    it = iter(items)
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True


@dataclass
class ValueTargets:
    """What one step's values give the policy and the value update (all ``[B, W]``, the reading's columns: ``[B, G]``
    for a masked family, ``[B, S * G]`` for a uniform-state one; 0 off the counted tokens)."""

    old_values: torch.Tensor
    returns: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor  # bool: the tokens that have a value (counted, committed)


class ValueLearner:
    """The value model of an RL run, its optimiser, and the step-level calls the trainer makes."""

    def __init__(self, cfg, policy: DiffusionLM, accelerator):
        v = cfg.value_model
        self.cfg, self.vcfg, self.accelerator = cfg, v, accelerator
        opts = cfg.estimator_options or {}
        self.shrinkage = int(v.shrinkage or (opts.get("shrinkage", 1) if cfg.estimator == "trace" else 1))
        self.backbone = self._backbone(cfg, policy)
        self.model = ValueModel(self.backbone).train()
        self.reading = value_reading(self.backbone, v, self.shrinkage)
        self.lr = float(v.lr if v.lr is not None else 5.0 * cfg.optim.lr)
        self.optimizer = build_optimizer(self.model, replace(cfg.optim, lr=self.lr),
                                         key="value_model.lr" if v.lr is not None else "value_model.lr (5 x optim.lr)")
        with deepspeed_clipping(accelerator, v.max_grad_norm):  # DeepSpeed clips inside its engine's step
            self.module, self.optimizer = accelerator.prepare(self.model, self.optimizer)
        self.micro_batch_size = int(v.micro_batch_size or cfg.train.micro_batch_size)

    @staticmethod
    def _backbone(cfg, policy: DiffusionLM) -> DiffusionLM:
        source = cfg.value_model.init_from
        if source == "policy":
            if cfg.lora.enabled:  # the policy's frozen base (shared tensors) with the value model's own adapter
                return apply_lora(merged_model(policy, device=policy.device), cfg.lora, seed=cfg.run.seed + 1)
            return copy.deepcopy(policy)
        family = detect_family(read_config(source), f"{source}/config.json")
        if family.name != policy.family.name:
            raise ConfigError(f"value_model.init_from: {source} is a {family.name} model and the policy a "
                              f"{policy.family.name} model; the value backbone must be of the policy's family")
        return load_model(source, dtype=policy.dtype, device=policy.device)  # model.dtype as the policy resolved it

    # ------------------------------------------------------------------------------------ one step
    def _micro_batches(self, n: int) -> list[list[int]]:
        return micro_batches(self.accelerator, n, self.micro_batch_size)  # as many on every rank

    @torch.no_grad()
    def values(self, batch: ScoringBatch) -> torch.Tensor:
        """``[B, G]``: the current value model's token values (no gradient), micro-batched. Every rank runs as
        many forwards (an empty micro-batch runs a one-token one): under FSDP2 each forward gathers shards."""
        out = torch.zeros(batch.batch_size, self.reading.width(batch), dtype=torch.float32,
                          device=self.backbone.device)
        for mb in self._micro_batches(batch.batch_size):
            if mb:
                out[mb] = sum(v for v, _ in self.reading.chunks(self.module, batch.select(mb), grad=False))
            elif self.accelerator.num_processes > 1:
                self._zero_loss()
        return out

    def targets(self, batch: ScoringBatch, rewards: torch.Tensor,
                step_scores: Sequence[Sequence[float] | None] | None = None) -> ValueTargets:
        """Old values, returns and token advantages of ``batch``: outcome ``rewards`` ``[B]`` on each sample's
        last merged step, or a sample's per-step ``step_scores`` (process rewards, see
        :func:`dllm_rl.rl.returns.process_step_rewards`) where given."""
        old = self.values(batch)
        rank, num = self.reading.ranks(batch)
        width = max(int(num.max().item()) if num.numel() else 1, 1)
        step_r = outcome_step_rewards(rewards.to(rank.device), num, width)
        if step_scores is not None and any(s is not None for s in step_scores):
            raw_rank = self.reading.decoding_ranks(batch)
            proc = process_step_rewards(step_scores, raw_rank, rank, width)
            given = torch.tensor([s is not None for s in step_scores], device=rank.device)
            step_r = torch.where(given[:, None], proc, step_r)
        device = old.device
        ret, adv = token_returns_advantages(old, rank.to(device), num.to(device), step_r.to(device),
                                            self.vcfg.gamma, self.vcfg.lam)
        mask = (rank >= 0).to(device)
        if self.vcfg.whiten:
            adv = whiten(adv, mask, total=lambda v: sum_over_ranks(self.accelerator, v))
        return ValueTargets(old, ret, adv, mask)

    def _zero_loss(self) -> torch.Tensor:
        return self.reading.idle(self.module).sum() * 0.0

    def update(self, batch: ScoringBatch, t: ValueTargets) -> dict[str, float]:
        """``value_model.epochs`` passes of the clipped value loss over ``batch``, one optimiser step per pass
        (the loss is the token mean over the whole batch). Returns the value metrics of the step."""
        acc = self.accelerator
        # the token mean over every rank's batch (the gradient all-reduce averages over the ranks)
        total = max(sum_over_ranks(acc, [float(t.mask.sum())])[0], 1.0) / acc.num_processes
        losses, fracs = [], [0.0, 0.0]  # clipped tokens, tokens
        for _ in range(self.vcfg.epochs):
            mbs = self._micro_batches(batch.batch_size)
            loss_sum = 0.0
            for j, mb in enumerate(mbs):
                with micro_step(acc, self.module, last=j == len(mbs) - 1):
                    loss_sum += self._micro_update(batch.select(mb) if mb else None, t, mb, total, fracs)
            if self.vcfg.max_grad_norm:
                clip_gradients(acc, self.module, self.vcfg.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            losses.append(loss_sum)
        sel = t.mask
        ret, old, adv = t.returns[sel], t.old_values[sel], t.advantages[sel]
        var = float(ret.var(unbiased=False)) if ret.numel() > 1 else 0.0
        explained = 1.0 - float((ret - old).var(unbiased=False)) / var if var > 0 else float("nan")
        return {"value_loss": losses[0], "value_loss_last": losses[-1],
                "value_clip_frac": fracs[0] / fracs[1] if fracs[1] else 0.0,
                "value_mean": float(old.mean()) if old.numel() else 0.0,
                "return_mean": float(ret.mean()) if ret.numel() else 0.0,
                "token_adv_mean": float(adv.mean()) if adv.numel() else 0.0,
                "token_adv_std": float(adv.std(unbiased=False)) if adv.numel() > 1 else 0.0,
                "value_explained_var": explained if math.isfinite(explained) else 0.0}

    def _micro_update(self, sub: ScoringBatch | None, t: ValueTargets, mb: list[int], total: float,
                      fracs: list[float]) -> float:
        """Back-propagate the value loss of the micro-batch ``sub`` (samples ``mb``; None: a rank's padding), a
        chunk of its columns at a time (the reading's: all at once for a masked family, ``value_model.step_chunk_size``
        steps for a uniform-state one); each chunk weighs its share of the ``total`` tokens, so the parts sum to the
        micro-batch's loss. Returns that loss (detached) and adds its clipped and valued tokens to ``fracs``."""
        acc, done = self.accelerator, 0.0
        parts = _with_last(self.reading.chunks(self.module, sub, grad=True)) if sub is not None else iter(())
        backed = False
        for (vals, cols), last in parts:
            mask = t.mask[mb] if cols is None else t.mask[mb] & cols
            loss, frac = clipped_value_loss(vals, t.old_values[mb], t.returns[mb], mask, self.vcfg.epsilon)
            n = float(mask.sum())
            backward(acc, self.module, loss * (n / total), boundary=last)
            backed = True
            done += float(loss.detach()) * n / total
            fracs[0], fracs[1] = fracs[0] + frac * n, fracs[1] + n
        if not backed:  # nothing to value: the same forward and backward as the other ranks make
            backward(acc, self.module, self._zero_loss())
        return done

    # ------------------------------------------------------------------------------ trainer glue
    def token_advantages(self, batch: ScoringBatch, rewards: torch.Tensor, keep: torch.Tensor,
                         step_scores: Sequence[Sequence[float] | None]) -> tuple[ValueTargets, torch.Tensor]:
        """What the RL trainer calls after the rollouts: the :meth:`targets` of the kept samples ``batch``
        (``keep``: their indices among ``rewards`` ``[N]``, ``step_scores`` per sample of the step), computed at
        the batch's layout block (the training layout's), and ``[N, W]`` token advantages on the CPU (0 for
        dropped samples; ``W``: the reading's columns, ``G`` for a masked family, ``S * G`` for a uniform-state one,
        the columns of the trajectory estimator's scores)."""
        t = self.targets(batch, rewards[keep], [step_scores[i] for i in keep.tolist()])
        adv = torch.zeros(len(rewards), t.advantages.shape[1])  # the reading's columns
        adv[keep] = t.advantages.cpu()
        return t, adv

    def fit(self, batch: ScoringBatch, t: ValueTargets) -> dict[str, float]:
        """:meth:`update` (the trainer calls it after the policy update)."""
        return self.update(batch, t)

    # ------------------------------------------------------------------------------- checkpoints
    def checkpoint_files(self) -> dict[str, Callable[[Path], object]]:
        """The files this value model adds to a checkpoint: ``{name: write(path)}``, written by
        :func:`dllm_rl.training.save_checkpoint` into the checkpoint's temporary folder (main process), before
        its state file and the rename, so that a checkpoint holds its value model or does not exist."""
        if is_sharded(self.accelerator):  # prepared with the policy: accelerator.save_state holds its shards
            return {}
        return {STATE_FILE: self.write}

    def write(self, path: str | Path) -> Path:
        """Write the value model's weights and optimiser state to the file ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch_save({"model": self.accelerator.unwrap_model(self.module).state_dict(),
                    "optimizer": self.optimizer.state_dict(), "lr": self.lr}, path)  # a full disk keeps its ENOSPC
        return path

    def load(self, directory: str | Path) -> None:
        """Restore what :meth:`write` wrote (exact resume). Under FSDP2 / DeepSpeed the checkpoint's
        ``accelerator.load_state`` has restored the value model and its optimizer already."""
        if is_sharded(self.accelerator):
            return
        path = Path(directory) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: this checkpoint has no value model (saved with value_model.enabled="
                                    "false); resume with value_model.enabled=false or start a new run")
        state = torch.load(path, map_location=self.backbone.device, weights_only=True)
        self.accelerator.unwrap_model(self.module).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def steps_after_hook(steps: list[list[float] | None], before: Any, rewards: list[float], after: Any,
                     new_rewards: list[float]) -> list[list[float] | None]:
    """A round's per-step scores once a rollout hook has run: kept for the samples the hook left as they were
    (same completion, decoding steps and reward), ``None`` (an outcome reward) for the ones it replaced."""
    if after is before:
        return [s if r == n else None for s, r, n in zip(steps, rewards, new_rewards)]
    return [s if r == n and torch.equal(before.completion_ids[i], after.completion_ids[i])
            and torch.equal(before.step_map[i], after.step_map[i]) else None
            for i, (s, r, n) in enumerate(zip(steps, rewards, new_rewards))]
