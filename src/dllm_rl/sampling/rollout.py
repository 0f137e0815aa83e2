"""`Rollout`: a batch of decoded completions with the trace of how they were decoded.

Semantics of the fields are documented in :mod:`dllm_rl.sampling` (the package docstring); in short,
``step_map[b, j]`` is the 0-based step of sequence b at which completion token j was committed, -1 where
it was never generated. ``step_tokens`` / ``step_masked`` / ``step_confidence`` (``[B, S, G]``, only with
``generate(..., record_steps="sampled" | "greedy")``) hold every step's full prediction
(:mod:`dllm_rl.sampling.step_record`). A uniform-state rollout (DiffusionGemma) carries its trajectory in
``uniform`` (:class:`~dllm_rl.sampling.uniform_rollout.UniformTrace`) and its own ``step_map``
(:mod:`dllm_rl.sampling.uniform_rollout`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling.uniform_rollout import UniformTrace


def _pad_cols(t: torch.Tensor, width: int, value, left: bool = False) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    pad = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def _pad_steps(t: torch.Tensor, steps: int, width: int, value) -> torch.Tensor:
    """``t`` (``[B, S, G]``) right-padded with ``value`` to ``[B, steps, width]``."""
    out = torch.full((t.shape[0], steps, width), value, dtype=t.dtype, device=t.device)
    out[:, :t.shape[1], :t.shape[2]] = t
    return out


@dataclass
class Rollout:
    """Prompts (left-padded), completions (left-aligned, right-padded) and their decoding trace."""

    prompt_ids: torch.Tensor  # [B, P] long, left-padded with pad_token_id
    prompt_mask: torch.Tensor  # [B, P] bool, real prompt tokens
    completion_ids: torch.Tensor  # [B, G] long
    completion_mask: torch.Tensor  # [B, G] bool, the answer: up to and including the first EOS
    step_map: torch.Tensor  # [B, G] long, global step at which each token was committed; -1 never generated
    nfe: torch.Tensor  # [B] long, forward passes spent on each sequence
    finish_reason: list[str]  # "eos" | "length"
    texts: list[str] | None = None  # decoded answers (up to the first EOS, special tokens skipped)
    confidence: torch.Tensor | None = None  # [B, G] float32, the rule's score at commit time (0 where -1)
    entropy: torch.Tensor | None = None  # [B, G] float32, the model distribution's entropy at commit time (0 where -1)
    pad_token_id: int = 0
    block_size: int | None = None  # block models: the attention block decoded in (the trace's blocks); else None
    images: PromptImages | None = None  # LLaDA-V: the image features spliced into each prompt (offsets in it)
    prefilled: torch.Tensor | None = None  # [B, G] bool, tokens committed before decoding (inpainted); None: none
    # record_steps: per step s, the state before it with its predicted tokens at the block's masked slots (int32),
    # which slots were masked then, and their scores (0 elsewhere); steps past a row's nfe: pad id, False, 0
    step_tokens: torch.Tensor | None = None  # [B, S, G] int32
    step_masked: torch.Tensor | None = None  # [B, S, G] bool
    step_confidence: torch.Tensor | None = None  # [B, S, G] float32
    # uniform-state families (DiffusionGemma): every step's canvas, draws, accepted positions, self-conditioning and
    # counted rows, [B, S] / [B, S, G] (dllm_rl.sampling.uniform_rollout); None for masked diffusion
    uniform: UniformTrace | None = None

    _ROW_TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "step_map", "nfe",
                    "confidence", "entropy", "prefilled", "step_tokens", "step_masked", "step_confidence")
    _STEP_FILL = {"step_tokens": None, "step_masked": False, "step_confidence": 0.0}  # None: the pad id

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    def to(self, device) -> Rollout:
        """A copy with every tensor on ``device``."""
        moved = {n: getattr(self, n).to(device) for n in self._ROW_TENSORS if getattr(self, n) is not None}
        if self.images is not None:
            moved["images"] = self.images.to(device)
        if self.uniform is not None:
            moved["uniform"] = self.uniform.to(device)
        return replace(self, **moved)

    def select(self, idx) -> Rollout:
        """The rows ``idx`` (an int, a slice, a list of ints or a 1-D long/bool tensor), in that order."""
        if isinstance(idx, int):
            idx = [idx]
        if isinstance(idx, slice):
            idx = list(range(len(self)))[idx]
        index = torch.as_tensor(idx, device=self.prompt_ids.device)
        if index.dtype == torch.bool:
            index = index.nonzero().flatten()
        rows = index.tolist()
        out = {n: getattr(self, n)[index] for n in self._ROW_TENSORS if getattr(self, n) is not None}
        out["finish_reason"] = [self.finish_reason[i] for i in rows]
        out["texts"] = [self.texts[i] for i in rows] if self.texts is not None else None
        out["images"] = self.images.select(rows) if self.images is not None else None
        out["uniform"] = self.uniform.select(index) if self.uniform is not None else None
        return replace(self, **out)

    @staticmethod
    def cat(rollouts: list[Rollout]) -> Rollout:
        """Concatenate rows; prompts are left-padded and completions right-padded to the widest."""
        if not rollouts:
            raise ValueError("Rollout.cat: nothing to concatenate")
        first = rollouts[0]
        pad = first.pad_token_id
        p_w = max(r.prompt_ids.shape[1] for r in rollouts)
        g_w = max(r.completion_ids.shape[1] for r in rollouts)
        with_conf = all(r.confidence is not None for r in rollouts)
        with_ent = all(r.entropy is not None for r in rollouts)
        with_text = all(r.texts is not None for r in rollouts)
        steps = {}
        if all(r.step_tokens is not None for r in rollouts):
            s_w = max(r.step_tokens.shape[1] for r in rollouts)
            steps = {name: torch.cat([_pad_steps(getattr(r, name), s_w, g_w, pad if fill is None else fill)
                                      for r in rollouts]) for name, fill in Rollout._STEP_FILL.items()}
        with_prefill = any(r.prefilled is not None for r in rollouts)
        if len({r.uniform is None for r in rollouts}) > 1:
            raise ValueError("Rollout.cat: uniform-state and masked rollouts do not mix")
        uniform = UniformTrace.cat([r.uniform for r in rollouts], g_w, pad) if first.uniform is not None else None
        blocks = {r.block_size for r in rollouts}
        if len(blocks) > 1:
            raise ValueError(f"Rollout.cat: rollouts decoded at different blocks ({sorted(blocks, key=str)})")
        return Rollout(
            prompt_ids=torch.cat([_pad_cols(r.prompt_ids, p_w, pad, left=True) for r in rollouts]),
            prompt_mask=torch.cat([_pad_cols(r.prompt_mask, p_w, False, left=True) for r in rollouts]),
            completion_ids=torch.cat([_pad_cols(r.completion_ids, g_w, pad) for r in rollouts]),
            completion_mask=torch.cat([_pad_cols(r.completion_mask, g_w, False) for r in rollouts]),
            step_map=torch.cat([_pad_cols(r.step_map, g_w, -1) for r in rollouts]),
            nfe=torch.cat([r.nfe for r in rollouts]),
            finish_reason=[f for r in rollouts for f in r.finish_reason],
            texts=[t for r in rollouts for t in r.texts] if with_text else None,
            confidence=torch.cat([_pad_cols(r.confidence, g_w, 0.0) for r in rollouts]) if with_conf else None,
            entropy=torch.cat([_pad_cols(r.entropy, g_w, 0.0) for r in rollouts]) if with_ent else None,
            pad_token_id=pad,
            block_size=first.block_size,
            images=PromptImages.cat([r.images for r in rollouts], [len(r) for r in rollouts]),
            prefilled=torch.cat([_pad_cols(r.prefilled if r.prefilled is not None else
                                           torch.zeros_like(r.completion_mask), g_w, False)
                                 for r in rollouts]) if with_prefill else None,
            uniform=uniform,
            **steps,
        )

    def decoded_tokens(self) -> torch.Tensor:
        """``[B]``: the tokens the sampler produced per row: those committed at some step (``step_map >= 0``), or for
        a uniform-state rollout, whose kept canvases are all produced, the answer's."""
        return self.completion_mask.sum(-1) if self.uniform is not None else (self.step_map >= 0).sum(-1)

    def completion_lengths(self) -> torch.Tensor:
        """Tokens in each answer (``completion_mask.sum(-1)``)."""
        return self.completion_mask.sum(-1)

    def tokens_per_forward(self) -> torch.Tensor:
        """Each row's answer tokens per forward pass spent on it (TPF, float32 ``[B]``: ``completion_lengths / nfe``;
        0 for a row without a pass), the parallelism LightningRL (arXiv 2603.13319) rewards."""
        return self.completion_lengths().float() / self.nfe.clamp(min=1).float() * (self.nfe > 0)

    def as_dict(self) -> dict:
        """Field name -> value (tensors as they are), e.g. for ``torch.save``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
