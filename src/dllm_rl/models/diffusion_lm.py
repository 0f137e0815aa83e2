"""`DiffusionLM`: a stock HF causal-LM module driven as a masked diffusion model.

The wrapper owns the three things that differ between families — the attention rule, the mask id and
Dream's logit shift — so callers always get "logits for position i" and never build masks by hand
unless they want a special layout (KV cache, two-stream training).

One file (about 430 lines) because its parts are one object's: the forward with its masks and position ids, the
selected log-probabilities that forward projects (``select``), the image-feature splice into its input embeddings,
and the attributes every caller reads (mask, EOS and pad ids, block size, the family). Split apart, each would reach
into the same wrapped module and the same hooks.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dllm_rl.models.families import Family
from dllm_rl.models.logprobs import head_selects
from dllm_rl.models.lora_twins import tie_lora_twins
from dllm_rl.models.masks import block_causal_bias, full_bias, position_ids_from_valid


@dataclass
class DLMOutput:
    """``logits[:, i]`` scores the token at position ``i`` (after Dream's shift is undone).

    With ``logits_to_keep`` (see :meth:`DiffusionLM.forward`) ``logits`` is ``[B, K, V]`` and
    ``logits[:, k]`` scores the ``k``-th kept query position. ``last_raw_logits`` (``[B, 1, V]``) is the
    model's raw output at the last query position whatever was kept, which a Dream caller feeding the
    next chunk through a KV cache passes back as ``prev_raw_logits``. With ``select`` both are ``None`` and
    ``logprobs`` (``[N]`` float32) holds the selected log-probabilities (:class:`Selection`).
    """

    logits: torch.Tensor | None
    last_raw_logits: torch.Tensor | None
    past_key_values: Any = None
    logprobs: torch.Tensor | None = None


@dataclass
class Selection:
    """Which log-probabilities a forward returns instead of logits: ``log p(targets[n])`` of the token at column
    ``cols[n]`` of row ``rows[n]``, projected through the LM head ``chunk_size`` positions at a time
    (:func:`dllm_rl.models.logprobs.selected_logprobs`); ``targets=None``: the entropy of the predicted
    distribution there instead (:func:`~dllm_rl.models.logprobs.selected_entropy`). ``aligned=False``: ``cols``
    already name the raw output columns (a shifted family's two-stream layout), so Dream's shift is not applied
    to them."""

    rows: torch.Tensor
    cols: torch.Tensor
    targets: torch.Tensor | None
    chunk_size: int
    aligned: bool = True


@dataclass
class EmbedSplice:
    """Input embeddings given by the caller instead of the token embeddings at some positions: the ``n``-th
    ``True`` entry of ``where`` (``[B, T]`` bool over the forward's ``input_ids``, row-major order) gets
    ``vectors[n]`` (``[N, H]``). An image in a prompt is such a splice (its features sit where its
    placeholder was, see :func:`dllm_rl.models.llava_images.image_prompts`); the ids at those positions are
    embedded and then replaced, so any valid id may stand there."""

    where: torch.Tensor
    vectors: torch.Tensor

    def take(self, rows: torch.Tensor, start: int = 0, stop: int | None = None) -> EmbedSplice | None:
        """The splice of a forward over rows ``rows`` and columns ``[start, stop)`` of this one (a KV-cached step
        forwards a window of the canvas), or ``None`` when no spliced position lies there."""
        where = self.where[rows, start:stop]
        if not bool(where.any()):
            return None
        order = self.where.flatten().long().cumsum(0).sub(1).view_as(self.where)  # n-th True -> n
        return EmbedSplice(where, self.vectors[order[rows, start:stop][where]])

    def apply(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the input embeddings ``[B, T, H]``) with ``vectors`` at ``where`` (a new tensor: gradients
        flow). The engine's splice (:class:`~dllm_rl.sampling.row_splice.RowSplice`) writes in place instead."""
        if self.where.shape != out.shape[:-1]:
            raise ValueError(f"EmbedSplice.where has shape {tuple(self.where.shape)}, the input ids "
                             f"{tuple(out.shape[:-1])}")
        return out.masked_scatter(self.where.to(out.device)[..., None], self.vectors.to(out.dtype))


@contextmanager
def embeddings_spliced(embedding: nn.Module, splice: EmbedSplice | None) -> Iterator[None]:
    """For the calls inside the block, ``embedding``'s output carries ``splice.vectors`` at ``splice.where``.

    A forward hook on the model's own input embedding, so the splice happens inside the wrapped forward:
    FSDP2 / ZeRO-3 hold the embedding's full weight only there, and DDP / PEFT wrappers see the usual call.
    Gradients reach both the embedding (at the other positions) and ``splice.vectors``."""
    if splice is None:
        yield
        return

    def hook(module, args, out):
        return splice.apply(out)

    handle = embedding.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class DiffusionLM(nn.Module):
    """A diffusion LM of one family over a stock transformers ``*ForCausalLM`` module (``self.model``)."""

    def __init__(self, model: nn.Module, family: Family, published_config: dict[str, Any],
                 generation_config: dict[str, Any] | None = None):
        super().__init__()
        self.model = model
        self.family = family
        self.published_config = dict(published_config)
        # The checkpoint's generation_config.json (None: it has none), kept to be saved back: its EOS ids count.
        self.generation_config = None if generation_config is None else dict(generation_config)
        pub = self.published_config
        mask = pub.get("mask_token_id", family.mask_token_id)
        self.mask_token_id: int | None = None if mask is None else int(mask)  # None: uniform-state noise
        text = pub.get("text_config") or {}  # a multimodal published config (DiffusionGemma) keeps its ids there
        # Every id that ends a row (Gemma's configs list end of sequence and end of turn, a Qwen3 chat model's
        # generation_config end of turn and end of text; dllm_rl.models.eos tests a token); the first is the EOS a
        # caller appends or pads with.
        self.eos_token_ids: tuple[int, ...] = family.eos_ids_of(pub, self.generation_config)
        self.eos_token_id: int = self.eos_token_ids[0]
        pad = pub.get("pad_token_id", text.get("pad_token_id"))
        self.pad_token_id: int = int(pad if pad is not None else self.eos_token_id)
        # The model's own block (its published config's; None for full attention). Code that runs a block model at
        # another block passes that block explicitly (``forward(block_size=)``, ``ScoringBatch.block_size``,
        # ``DecodeConfig.block_size``): nothing changes this attribute to run at another block.
        self.block_size: int | None = family.block_size_of(pub)

    # ------------------------------------------------------------------------------------------
    @property
    def hf_model(self) -> nn.Module:
        """The stock HF module, unwrapped from a distributed (DDP/FSDP) wrapper if there is one."""
        return getattr(self.model, "module", self.model)

    @property
    def causal_lm(self) -> nn.Module:
        """The stock ``*ForCausalLM`` module, unwrapped from DDP/FSDP and from a PEFT wrapper."""
        model = self.hf_model
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    @property
    def lm_head(self) -> nn.Module:
        """The LM head (output projection onto the vocabulary) as a module (LoRA-wrapped if adapted)."""
        return self.causal_lm.get_output_embeddings()

    @property
    def config(self):
        """The language model's HF config (a multimodal model's text config; a text model's own config)."""
        return self.hf_model.config.get_text_config()

    @property
    def is_block_causal(self) -> bool:
        return self.family.attention == "block"

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_length(self) -> int:
        return int(self.config.max_position_embeddings)

    def num_parameters(self) -> int:
        seen: set[int] = set()
        total = 0
        for p in self.model.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        return total

    def layout_block(self, block_size: int | None = None) -> int | None:
        """The block a block model's attention rule uses: ``block_size`` when given, else the model's own;
        ``None`` for a full-attention model (which has no block, whatever is asked)."""
        if not self.is_block_causal:
            return None
        return int(block_size if block_size is not None else self.block_size)

    def default_bias(self, valid: torch.Tensor, position_ids: torch.Tensor, block_size: int | None = None
                     ) -> torch.Tensor:
        """The family's own attention rule over ``valid`` tokens (full, or block-causal at
        :meth:`layout_block` ``(block_size)``)."""
        if self.is_block_causal:
            return block_causal_bias(valid, self.layout_block(block_size), position_ids, dtype=self.dtype)
        return full_bias(valid, dtype=self.dtype)

    def align_logits(
        self,
        raw: torch.Tensor,
        prev_raw_logits: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Undo the family's shift: for Dream, ``aligned[:, i] = raw[:, i-1]``.

        A position with no real token before it (the first real token of a left-padded row) reads its
        own raw logits, as the published Dream sampler does for position 0. Column 0 of a KV-cached
        chunk reads ``prev_raw_logits`` (the raw logits of the token before the chunk) when given.
        """
        if not self.family.shift:
            return raw
        first = prev_raw_logits.to(raw.dtype) if prev_raw_logits is not None else raw[:, :1]
        shifted = torch.cat([first, raw[:, :-1]], dim=1)
        if valid is None:
            return shifted
        prev_valid = torch.cat(
            [torch.full_like(valid[:, :1], prev_raw_logits is not None), valid[:, :-1]], dim=1
        ).bool()
        return torch.where(prev_valid[..., None], shifted, raw)

    def raw_columns(self, rows: torch.Tensor, cols: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """The raw output column that scores the token at column ``cols`` of row ``rows`` (equal shapes).

        The identity except for Dream, where it is the column :meth:`align_logits` reads (``i - 1``, or ``i``
        for a row's first real token / column 0): ``hidden[rows, raw_columns(rows, cols, valid)]`` projected
        by :attr:`lm_head` equals ``forward(...).logits[rows, cols]``. ``valid`` is the ``attention_mask``
        given to :meth:`forward` (``None`` if none was).
        """
        if not self.family.shift:
            return cols
        prev = (cols - 1).clamp(min=0)
        if valid is None:
            return prev
        return torch.where((cols > 0) & valid[rows, prev].bool(), prev, cols)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attn_bias: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool = False,
        prev_raw_logits: torch.Tensor | None = None,
        logits_to_keep: int | torch.Tensor | None = None,
        align: bool = True,
        select: Selection | None = None,
        block_size: int | None = None,
        splice: EmbedSplice | None = None,
        adapter_names: list[str] | None = None,
    ) -> DLMOutput:
        """Run the model.

        ``attention_mask`` is the usual 2D ``[B, T]`` 1/0 valid-token mask (left padding is fine);
        positions then count real tokens only and the family's attention rule is applied. With a custom
        ``attn_bias`` it is optional and only tells Dream's shift where each row starts. Pass
        ``attn_bias`` (additive ``[B, 1, Tq, Tk]``, see :mod:`dllm_rl.models.masks`) and ``position_ids``
        for any other layout, and always when using ``past_key_values``.

        ``logits_to_keep`` projects only some query positions onto the vocabulary (the LM head over every
        position dominates memory and time at real vocabulary sizes): ``None``/``0`` keeps all, an ``int``
        ``k`` the last ``k`` query positions, a 1-D integer tensor the listed query positions (shared by the
        batch; sorted by convention, duplicates allowed). ``logits`` is then ``[B, K, V]`` and equals the
        full forward's ``logits`` at those positions. For Dream the raw logits at ``i - 1`` and ``i`` of each
        kept ``i`` are computed and aligned exactly as :meth:`align_logits` does. ``align=False`` returns a
        shifted family's raw logits (position ``i`` scoring token ``i + 1``), for layouts whose previous
        column is not the previous position (the two-stream layout).

        ``select`` (a :class:`Selection`) returns the selected log-probabilities instead of logits
        (``logprobs``; ``logits`` and ``last_raw_logits`` are ``None``): during the HF module's forward its LM
        head projects only the selected positions, a chunk at a time
        (:func:`dllm_rl.models.logprobs.head_selects`), so no ``[positions, V]`` logits exist. The call still
        goes through ``self.model``, so DDP / FSDP2 / DeepSpeed and PEFT wrappers run as usual.

        ``block_size``: the block of a block model's default attention rule (``None``: the model's own); it has no
        effect with an explicit ``attn_bias`` (which already encodes its block) or on a full-attention model.

        ``splice`` (an :class:`EmbedSplice`) gives the input embeddings of some positions (an image's features
        in a prompt) instead of the embeddings of their ids.

        ``adapter_names`` (one per row; a model with named LoRA adapters, in eval mode) decodes each row with its
        own adapter, ``"__base__"`` with none: ``peft``'s mixed-adapter batch, each row as it would be alone.
        """
        shift = self.family.shift and align
        valid = attention_mask.bool() if attention_mask is not None else None
        if attn_bias is None:
            if past_key_values is not None:
                raise ValueError("DiffusionLM.forward: pass attn_bias and position_ids when using a KV cache")
            if valid is None:
                valid = torch.ones_like(input_ids, dtype=torch.bool)
            if position_ids is None:
                position_ids = position_ids_from_valid(valid)
            attn_bias = self.default_bias(valid, position_ids, block_size)
        elif position_ids is None:
            raise ValueError("DiffusionLM.forward: position_ids are required with a custom attn_bias")
        if select is not None:
            if logits_to_keep is not None:
                raise ValueError("DiffusionLM.forward: select projects its own columns; drop logits_to_keep")
            return self._selected_forward(select, input_ids, attn_bias, position_ids, valid, past_key_values,
                                          use_cache, splice, adapter_names)
        keep = _check_keep(logits_to_keep, input_ids.shape[1])
        hf_keep: int | torch.Tensor | None = None
        if keep is not None and shift:
            keep, hf_keep, raw_index = self._shifted_keep(keep, input_ids.shape[1], input_ids.device)
        elif keep is not None:
            # The last query position rides along so that ``last_raw_logits`` stays exact (one more row).
            if isinstance(keep, int):
                hf_keep = keep
            else:
                keep = keep.to(input_ids.device)
                hf_keep = torch.cat([keep, keep.new_full((1,), input_ids.shape[1] - 1)])
        extra = {} if hf_keep is None else {"logits_to_keep": hf_keep}
        out = self._hf_forward(input_ids, attn_bias, position_ids, past_key_values, use_cache, splice,
                               adapter_names, **extra)
        raw = out.logits
        if keep is None:
            logits = self.align_logits(raw, prev_raw_logits, valid) if shift else raw
        elif shift:
            logits = self._align_kept(raw, keep, raw_index, prev_raw_logits, valid)
        else:
            logits = raw if isinstance(keep, int) else raw[:, : keep.numel()]
        return DLMOutput(
            logits=logits,
            last_raw_logits=raw[:, -1:],
            past_key_values=out.cache if use_cache else None,
        )

    def _hf_forward(self, input_ids, attn_bias, position_ids, past_key_values, use_cache, splice=None,
                    adapter_names=None, **extra):
        """The (wrapped) HF module's forward with an additive 4D mask, the one call every path makes (a text
        forward never looks the input embedding up); ``adapter_names``: peft's per-row adapters."""
        if adapter_names is not None:
            extra["adapter_names"] = adapter_names
        spliced = nullcontext() if splice is None else embeddings_spliced(self.causal_lm.get_input_embeddings(), splice)
        with spliced:
            return self.model(input_ids=input_ids, attention_mask=attn_bias.to(self.dtype),
                              position_ids=position_ids, cache=past_key_values, use_cache=use_cache, **extra)

    def _selected_forward(self, select, input_ids, attn_bias, position_ids, valid, past_key_values, use_cache,
                          splice=None, adapter_names=None):
        """:meth:`forward` with ``select``: the LM head returns the selected log-probs (every column is passed to
        it as a view of the final hidden states; it projects only the selected ones)."""
        cols = self.raw_columns(select.rows, select.cols, valid) if select.aligned else select.cols
        with head_selects(self.lm_head, select.rows, cols, select.targets, select.chunk_size):
            out = self._hf_forward(input_ids, attn_bias, position_ids, past_key_values, use_cache, splice,
                                   adapter_names, logits_to_keep=0)
        return DLMOutput(logits=None, last_raw_logits=None, past_key_values=out.cache if use_cache else None,
                         logprobs=out.logits)

    @staticmethod
    def _shifted_keep(
        keep: int | torch.Tensor, width: int, device: torch.device
    ) -> tuple[torch.Tensor, int | torch.Tensor, tuple[Any, Any]]:
        """Raw positions a shifted family needs for kept query positions ``keep``: ``i - 1`` and ``i`` of
        each, plus the last query position. Returns ``(keep as a tensor, what to pass to the HF model,
        (index of raw i-1, index of raw i) into the raw logits it returns)`` — slices for an ``int``."""
        if isinstance(keep, int):  # the last k + 1 raw positions (k < width, so i - 1 >= 0 for all kept i)
            return torch.arange(width - keep, width, device=device), keep + 1, (slice(0, keep), slice(1, keep + 1))
        keep_t = keep.to(device)
        prev = (keep_t - 1).clamp(min=0)
        need = torch.unique(torch.cat([prev, keep_t, keep_t.new_full((1,), width - 1)]))  # sorted
        return keep_t, need, (torch.searchsorted(need, prev), torch.searchsorted(need, keep_t))

    def _align_kept(
        self,
        raw: torch.Tensor,
        keep: torch.Tensor,
        raw_index: tuple[Any, Any],
        prev_raw_logits: torch.Tensor | None,
        valid: torch.Tensor | None,
    ) -> torch.Tensor:
        """:meth:`align_logits` at the kept positions only, from the raw logits at the needed positions."""
        prev_idx, own_idx = raw_index
        shifted = raw[:, prev_idx]  # raw[i - 1]; raw[0] for i = 0, as align_logits without prev_raw_logits
        at_zero = (keep == 0)[None, :]
        if prev_raw_logits is not None and not isinstance(prev_idx, slice):  # a slice never holds column 0
            shifted = torch.where(at_zero[..., None], prev_raw_logits.to(raw.dtype), shifted)
        if valid is None:
            return shifted
        prev_valid = valid[:, (keep - 1).clamp(min=0)] & ~at_zero
        if prev_raw_logits is not None:
            prev_valid = prev_valid | at_zero
        if bool(prev_valid.all()):  # no row starts inside the kept columns: skip a [B, K, V] copy
            return shifted
        return torch.where(prev_valid[..., None], shifted, raw[:, own_idx])

    def over(self, module: nn.Module) -> DiffusionLM:
        """This model's wrapper (family, published and generation configs) over another HF ``module``: its unwrapped,
        merged or gathered copy."""
        return DiffusionLM(module, self.family, self.published_config, self.generation_config)

    # Conveniences delegated to the HF module.
    def tie_weights(self, *args, **kwargs) -> None:
        """Tie the HF module's tied weights again (its ``_tied_weights_keys``), then the LoRA adapters on tied twins
        (:func:`~dllm_rl.models.lora_twins.tie_lora_twins`, whatever names transformers' tie rules list):
        accelerate's FSDP2 preparation moves the model to the meta device, which unties them, and then calls the
        root's ``tie_weights``; without this one, DiffusionGemma's encoder/decoder twins came out of it as two
        trained copies."""
        self.hf_model.tie_weights(*args, **kwargs)
        if "peft" in sys.modules:  # adapters exist only where peft was imported (training.lora)
            tie_lora_twins(self.hf_model)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each decoder layer in backward (HF activation checkpointing; works in every layout)."""
        model = self.hf_model
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name is deprecated)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=gradient_checkpointing_kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)


def _check_keep(logits_to_keep: int | torch.Tensor | None, width: int) -> int | torch.Tensor | None:
    """Normalise ``logits_to_keep``: ``None`` for all positions, an ``int`` in ``[1, width]``, or a 1-D
    integer tensor; raise ``ValueError`` for anything else."""
    if logits_to_keep is None:
        return None
    if isinstance(logits_to_keep, torch.Tensor):
        if logits_to_keep.dim() != 1 or logits_to_keep.is_floating_point() or logits_to_keep.dtype == torch.bool:
            raise ValueError(
                "logits_to_keep must be an int or a 1-D integer tensor of query positions, got a tensor of "
                f"shape {tuple(logits_to_keep.shape)} and dtype {logits_to_keep.dtype}"
            )
        return logits_to_keep.long()
    if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
        raise ValueError(f"logits_to_keep must be None, an int >= 0 or a 1-D tensor, got {logits_to_keep!r}")
    if logits_to_keep == 0 or logits_to_keep >= width:
        return None
    return logits_to_keep
