"""Model families over stock transformers architectures, masks, loading and tokenizers."""

from dllm_rl.models.diffusion_lm import DiffusionLM, DLMOutput
from dllm_rl.models.families import FAMILIES, Family, detect_family, get_family, tiny_config
from dllm_rl.models.loading import build_model, load_model, published_state_dict, resolve_dtype, save_model
from dllm_rl.models.masks import (
    TwoStreamLayout,
    attention_bias,
    block_causal_bias,
    block_index,
    full_bias,
    position_ids_from_valid,
    two_stream_layout,
)
from dllm_rl.models.tokenizer import char_tokenizer, check_tokenizer, load_tokenizer, qwen_tokenizer

__all__ = [
    "DLMOutput", "DiffusionLM", "FAMILIES", "Family", "TwoStreamLayout", "attention_bias", "block_causal_bias",
    "block_index", "build_model", "char_tokenizer", "check_tokenizer", "detect_family", "full_bias", "get_family",
    "load_model", "load_tokenizer", "position_ids_from_valid", "published_state_dict", "qwen_tokenizer",
    "resolve_dtype", "save_model", "tiny_config", "two_stream_layout",
]
