"""Model families: published checkpoint layouts mapped onto stock transformers architectures.

A family is small: it reads a published ``config.json`` into a stock HF config, converts tensors in both
directions, and declares the mask id, the logit shift and the attention rule. No modeling code is copied;
the maths is HF's. Each family's module states the layout facts it relies on (tensor names, config keys, mask
id) and the published files they were read from; its tests check them on tiny published-layout checkpoints.
One module per family:

| family | published | stock class | attention | mask id | logits |
|--------|-----------|-------------|-----------|---------|--------|
| llada  | GSAI-ML/LLaDA-8B-Instruct | LlamaForCausalLM | full | 126336 | same position |
| dream  | Dream-org/Dream-v0-Instruct-7B, DiffuCoder, Dream-Coder | Qwen2ForCausalLM | full | 151666 | shifted |
| sdar   | JetLM/SDAR-*-Chat, Gen-Verse/TraDo | Qwen3ForCausalLM | block-causal (4) | 151669 | same position |
| llada2 | inclusionAI/LLaDA2.0-mini / -flash, LLaDA2.1 | Glm4MoeForCausalLM | block-causal (32) | 156895 | same |
| llada_moe | inclusionAI/LLaDA-MoE-7B-A1B | Qwen3MoeForCausalLM | full | 156895 | same position |
| sdar_moe | JetLM/SDAR-30B-A3B | Qwen3MoeForCausalLM | block-causal (4) | 151669 | same position |
| fast_dllm_v2 | Efficient-Large-Model/Fast_dLLM_v2_1.5B / 7B | Qwen2ForCausalLM | block (32) | 151665 | shifted |
| mmada  | Gen-Verse/MMaDA-8B-Base / -MixCoT (+ magvit.py codes) | LlamaForCausalLM | full | 126336 | same position |
| llada_v | GSAI-ML/LLaDA-V | LlavaOnevisionForConditionalGeneration (SigLIP + Llama) | full | 126336 | same |
| diffusion_gemma | google/diffusiongemma-26B-A4B-it | DiffusionGemmaForBlockDiffusion | canvas (256) | none | same |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

from dllm_rl.errors import UserError
from dllm_rl.models.families.base import Family
from dllm_rl.models.families.diffusion_gemma import DIFFUSION_GEMMA
from dllm_rl.models.families.llada import LLADA
from dllm_rl.models.families.llada2 import LLADA2
from dllm_rl.models.families.llada_v import LLADA_V
from dllm_rl.models.families.mmada import MMADA
from dllm_rl.models.families.qwen import DREAM, FAST_DLLM_V2, SDAR_FAMILY
from dllm_rl.models.families.qwen_moe import LLADA_MOE, SDAR_MOE

FAMILIES: dict[str, Family] = {f.name: f for f in (LLADA, DREAM, SDAR_FAMILY, LLADA2, LLADA_MOE, SDAR_MOE,
                                                     FAST_DLLM_V2, MMADA, LLADA_V, DIFFUSION_GEMMA)}


def get_family(name: str) -> Family:
    """The family called ``name`` (case-insensitive); a clear error lists the supported ones."""
    fam = FAMILIES.get(name.lower())
    if fam is None:
        raise UserError(f"unknown model family {name!r}; supported: {', '.join(FAMILIES)}")
    return fam


def _fuzzy(hint: str) -> Family | None:
    """The historical loose match on family names (``modeling_sdar.X``, ``sdar_chat``), longest name first
    so that ``sdar_moe`` is not taken for ``sdar``."""
    low = hint.lower()
    for name in sorted(FAMILIES, key=len, reverse=True):
        if low == name or low.startswith(name) or f"_{name}" in low or f".{name}" in low:
            return FAMILIES[name]
    return None


def detect_family(pub: dict[str, Any], source: str = "config.json") -> Family:
    """Find the family of a published config: an exact ``architectures`` class first (LLaDA-MoE shares
    ``model_type: llada`` with dense LLaDA), then the classes of ``auto_map``, then ``model_type``, then a
    loose match on family names."""
    archs = [str(a) for a in pub.get("architectures") or []]
    auto = [str(v).rsplit(".", 1)[-1] for v in (pub.get("auto_map") or {}).values()]
    for cls in archs + auto:
        for fam in FAMILIES.values():
            if cls in fam.architectures:
                return fam
    model_type = str(pub.get("model_type", ""))
    for fam in FAMILIES.values():
        if model_type and model_type.lower() == fam.model_type.lower():
            return fam
    for hint in [model_type] + archs + [str(v) for v in (pub.get("auto_map") or {}).values()]:
        fam = _fuzzy(hint) if hint else None
        if fam is not None:
            return fam
    raise UserError(
        f"{source}: cannot tell the model family from model_type={pub.get('model_type')!r}, "
        f"architectures={pub.get('architectures')!r}; supported families: {', '.join(FAMILIES)}"
    )


def _tokenizer_mask_id(tokenizer_dir: str | Path, fam: Family) -> int | None:
    """The mask id of the tokenizer in ``tokenizer_dir``: its mask token, else the family's mask token text
    in its vocabulary (None: no tokenizer there, or no mask token in it)."""
    if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return None
    tok = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    if tok.mask_token_id is not None:
        return int(tok.mask_token_id)
    found = tok.get_vocab().get(fam.mask_token) if fam.mask_token else None
    return None if found is None else int(found)


def resolve_mask_token_id(pub: dict[str, Any], fam: Family, source: str | Path,
                          tokenizer_dir: str | Path | None = None) -> int | None:
    """The mask id of a published config: its ``mask_token_id``; else (configs of several published
    families lack it) the tokenizer's mask token; else the family's published id. An id
    outside the embedding (``vocab_size`` rows) is refused, naming ``source`` (the config.json).
    None for a family of uniform-state noise (DiffusionGemma): it has no mask token, whatever the config says."""
    if fam.noise == "uniform":
        return None
    if "mask_token_id" in pub:
        mask_id, origin = int(pub["mask_token_id"]), f"{source}: mask_token_id {pub['mask_token_id']}"
    else:
        found = _tokenizer_mask_id(tokenizer_dir, fam) if tokenizer_dir is not None else None
        if found is not None:
            mask_id, origin = found, f"{source} has no mask_token_id, and the mask token of {tokenizer_dir} ({found})"
        else:
            mask_id = fam.mask_token_id
            origin = (f"{source} has no mask_token_id, {tokenizer_dir or 'the tokenizer'} has no mask token, and "
                      f"the {fam.name} default ({mask_id})")
    vocab = int(fam.hf_config(pub).get_text_config().vocab_size)
    if not 0 <= mask_id < vocab:
        raise UserError(f"{origin} is outside the vocabulary (vocab_size {vocab}); set mask_token_id in {source} "
                        "to the id of the mask token")
    return mask_id


def tiny_config(
    family: str,
    vocab_size: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    mask_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    block_size: int = 4,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool | None = None,
    rope_theta: float = 10000.0,
    **moe: int,
) -> dict[str, Any]:
    """A small published-layout ``config.json`` dict of ``family``'s shape, for tests and demos.

    Token ids default to the last ids of the vocabulary (mask = V-1, eos = pad = V-2). MoE families take
    ``num_experts`` (4), ``experts_per_token`` (2) and ``moe_intermediate_size`` (16); LLaDA2's tiny shape
    has one dense first layer, one shared expert and 2 expert groups (1 kept per token).
    ``tie_word_embeddings=None``: the family's published default (:meth:`Family.tied` of an empty config; untied
    but for DiffusionGemma).
    """
    fam = get_family(family)
    if moe and not fam.moe:
        raise TypeError(f"tiny_config({family!r}): {', '.join(moe)} apply to MoE families only")
    return fam.tiny(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                    num_kv_heads=num_kv_heads, intermediate_size=intermediate_size, mask_token_id=mask_token_id,
                    eos_token_id=eos_token_id, pad_token_id=pad_token_id, block_size=block_size,
                    max_position_embeddings=max_position_embeddings,
                    tie_word_embeddings=fam.tied({}) if tie_word_embeddings is None else tie_word_embeddings,
                    rope_theta=rope_theta, **moe)


__all__ = ["FAMILIES", "Family", "detect_family", "get_family", "resolve_mask_token_id", "tiny_config"]
