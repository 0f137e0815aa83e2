"""The :class:`Family` type every adapter fills in, and helpers the adapters share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from dllm_rl.errors import UserError


@dataclass(frozen=True)
class Family:
    """What the rest of the library needs to know about one published layout."""

    name: str
    attention: str  # "full" (bidirectional) or "block" (block-causal)
    shift: bool  # True when raw logits at i score token i+1 (Dream, Fast-dLLM v2)
    mask_token_id: int | None  # None: the family has no mask token (uniform-state noise)
    eos_token_id: int
    pad_token_id: int
    model_type: str
    architectures: tuple[str, ...]
    auto_map: dict[str, str] = field(default_factory=dict)
    block_size: int | None = None
    # The published config key that holds the block size (None: the published config has none; the family's
    # block_size applies, e.g. LLaDA2.x whose block 32 is a sampler setting).
    block_size_key: str | None = "block_size"
    mask_token: str | None = None  # the mask token's text in the published tokenizer
    moe: bool = False  # mixture of experts: routers, router statistics, freeze_router
    # The HF module name of the stack whose forward over a clean sequence the router statistics read, when the
    # model's own forward does not take one ("" = the model's forward): DiffusionGemma's causal text encoder, whose
    # routers share their weights with the canvas decoder's.
    router_stack: str = ""
    # LoRA targets, in HF module names (what peft sees).
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    # The HF module name(s) of the language model when the model holds more (a vision tower, a projector): LoRA
    # targets are adapted inside them only, so SigLIP's own q/k/v_proj stay frozen; "" = the whole model. Several
    # when the text runs through several stacks (DiffusionGemma's encoder and decoder, whose tied twins then share
    # one adapter: dllm_rl.models.lora_twins.tie_lora_twins).
    lora_scope: str | tuple[str, ...] = ""
    # Module classes (HF class names) that are FSDP units of their own besides the decoder layers the launch
    # config names: a vision tower's encoder layers, a projector (see dllm_rl.training.sharding).
    fsdp_units: tuple[str, ...] = ()
    # Module classes whose forward reads a child's parameter outside the child's call (DiffusionGemma's decoder: its
    # embedding matrix, for the self-conditioning soft embeddings): under FSDP2 each is one unit with the parameters
    # it holds outside the layer units (and their tied holders), so they are gathered for its whole forward
    # (dllm_rl.training.tied_units).
    fsdp_reader_units: tuple[str, ...] = ()
    # The transformers auto class that builds the stock module from :meth:`hf_config` (a multimodal family's
    # stock class is an image-text-to-text model, not a causal LM).
    hf_auto_class: type = AutoModelForCausalLM
    # The kind of noise the model was trained to remove: "mask" (a slot is a mask or a committed token, which stays;
    # every family but DiffusionGemma) or "uniform" (every slot holds a token, a step accepts some positions and
    # re-noises the rest with random ids; no mask token). Samplers and estimators read it; nothing else should.
    noise: str = "mask"
    # Ids a fresh tiny model (:meth:`tiny`) reserves after the tokenizer's (DiffusionGemma's three image ids), so
    # `dllm-rl sft` sizes its vocabulary to the tokenizer plus these.
    tiny_extra_ids: int = 0

    # -- config ---------------------------------------------------------------------------------
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        """The stock transformers config for a published ``config.json`` dict."""
        raise NotImplementedError

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        """The published ``config.json`` dict for ``hf``, keeping any unknown keys of ``base``."""
        raise NotImplementedError

    def tiny(self, **kw: Any) -> dict[str, Any]:
        """A small published-layout config (see :func:`dllm_rl.models.families.tiny_config`)."""
        raise NotImplementedError

    def block_size_of(self, pub: dict[str, Any]) -> int | None:
        """The block size of a block model from its published config (None for full attention)."""
        if self.attention != "block":
            return None
        value = pub.get(self.block_size_key) if self.block_size_key else None
        return int(value or self.block_size or 4)

    def eos_ids_of(self, pub: dict[str, Any], generation_config: dict[str, Any] | None = None) -> tuple[int, ...]:
        """Every EOS id of a published config (its own ``eos_token_id``, else its ``text_config``'s, else the
        family's; an id or a list, as Gemma's end of sequence and end of turn), then those of the checkpoint's
        ``generation_config.json`` that it lacks (transformers' ``from_pretrained`` loads that file, and the stock
        ``generate`` stops on its ids), in order."""
        text = pub.get("text_config") or {}
        vocab = pub.get("vocab_size", text.get("vocab_size"))
        own = ("config.json: eos_token_id" if "eos_token_id" in pub else "config.json: text_config.eos_token_id"
               if "eos_token_id" in text else f"the {self.name} family's default eos_token_id (config.json has none)")
        ids = _ids(pub.get("eos_token_id", text.get("eos_token_id", self.eos_token_id)), own, vocab)
        extra = _ids((generation_config or {}).get("eos_token_id"), "generation_config.json: eos_token_id", vocab)
        return tuple(dict.fromkeys(ids + extra)) or (int(self.eos_token_id),)

    # -- tensor names ---------------------------------------------------------------------------
    def to_hf_name(self, name: str) -> str:
        return name

    def to_published_name(self, name: str) -> str:
        return name

    def to_hf_state(self, tensors: dict[str, torch.Tensor], hf: PretrainedConfig) -> dict[str, torch.Tensor]:
        """Published tensors (one dict, all shards) under HF names; families whose HF layout fuses tensors
        (experts, fused qkv) override this."""
        return {self.to_hf_name(k): v for k, v in tensors.items()}

    def to_published_state(self, state: dict[str, torch.Tensor], hf: PretrainedConfig) -> dict[str, torch.Tensor]:
        return {self.to_published_name(k): v for k, v in state.items()}

    def tied(self, pub: dict[str, Any]) -> bool:
        return bool(pub.get("tie_word_embeddings", False))


def rope_theta(hf: PretrainedConfig) -> float:
    params = getattr(hf, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def require(pub: dict[str, Any], keys: list[str], family: str) -> None:
    missing = [k for k in keys if k not in pub]
    if missing:
        raise UserError(f"{family} config.json is missing required keys: {', '.join(missing)}")


def refuse(family: str, key: str, value: Any, why: str) -> None:
    raise UserError(f"{family} config.json: {key}={value!r} is not supported ({why}); this adapter maps the "
                    "published layout onto a stock transformers class that has no such option")


def ids(fam: Family, vocab_size: int, mask: int | None, eos: int | None, pad: int | None) -> tuple[int, int, int]:
    """Tiny-config token ids: mask = V-1, eos = pad = V-2 unless given."""
    m = vocab_size - 1 if mask is None else mask
    e = vocab_size - 2 if eos is None else eos
    return m, e, e if pad is None else pad


def _ids(value: Any, where: str, vocab: Any = None) -> tuple[int, ...]:
    """A config's ``eos_token_id`` (an id, a list of ids, or None) as a tuple; :class:`UserError` naming ``where``
    (the file and key) for anything else, or an id outside the vocabulary (``vocab``: its size, None: unknown), which
    the model can never produce and which, as the first id, SFT would append and the sampler fill with."""
    if value is None:
        return ()
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise UserError(f"{where}: expected a token id or a list of token ids, got {value!r}")
        if v < 0 or (isinstance(vocab, int) and v >= vocab):
            ids = f"vocab_size {vocab}: ids 0 to {vocab - 1}" if isinstance(vocab, int) else "ids are >= 0"
            raise UserError(f"{where}: id {v} is outside the vocabulary ({ids}); fix the checkpoint's file")
    return tuple(values)
