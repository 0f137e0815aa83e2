"""MMaDA (Gen-Verse/MMaDA-8B-Base / -MixCoT): LLaDA's layout and maths over a vocabulary widened by image codes.

Facts read from the published code (Gen-Verse/dLLM-RL ``models/mmada/``, ``sample/mmada_v_sample.py``,
``train/train_mmada_v_policy.py``; the hub config.json was out of reach):

- ``MMadaModelLM`` subclasses LLaDA's ``LLaDAModelLM`` unchanged (same ``model.transformer.*`` tensor names,
  bidirectional attention, no logit shift); its config (``model_type: mmada``) is LLaDA's keys plus
  ``llm_vocab_size`` (126464), ``codebook_size`` (8192) and ``new_vocab_size`` (134656 = ``vocab_size``), with
  ``num_vq_tokens``, ``num_new_special_tokens`` and ``llm_model_path`` riding along.
- Mask id 126336 (``<|mdm_mask|>``), eos = pad 126081. Understanding ids ``<|mmu|>`` 126089, ``<|soi|>`` 126084,
  ``<|eoi|>`` 126085 are hard-coded in the published sampler and trainer (see
  :mod:`dllm_rl.models.mmada_image` for the sequence they build).

Padding (checked against ``sample/mmada_v_sample.py`` and ``mmada_v_rl_rollout.py``, whose ``left_pad_batch``
fills with ``tokenizer.eos_token_id`` and whose forward gets no attention mask): prompts are left-padded with
eos = pad 126081, as published, but the padded positions are **not** attended and positions count real tokens
only, as for every family here. The published rule makes an item's logits depend on how many pads its batch
neighbours force on it; leaving the pads out makes each row equal the published model on that row alone (the
published output for an unpadded prompt, a batch of one), the same alone or in any batch, which the sampler,
the estimators and resumable evaluation rely on. Rows that need no padding are unchanged either way.

Saving writes the published config.json back unchanged while it still describes the model (so a checkpoint
round-trips to the same file); a model whose shape changed gets LLaDA's keys rewritten from its config.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from dllm_rl.errors import UserError
from dllm_rl.models.families.base import require, rope_theta
from dllm_rl.models.families.llada import LLaDA

MMU_ID, SOI_ID, EOI_ID = 126089, 126084, 126085

# The fields of the stock config that a published config.json determines: equal fields mean the published
# file still describes the model.
_SHAPE = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "attention_bias")
# Published options the stock Llama maths cannot express, with the value it implements.
_FIXED = {"block_type": "llama", "rope": True, "alibi": False, "scale_logits": False, "input_emb_norm": False,
          "attention_layer_norm": False, "layer_norm_type": "rms", "activation_type": "silu"}


def _shape(cfg: PretrainedConfig) -> tuple[Any, ...]:
    return tuple(getattr(cfg, k) for k in _SHAPE) + (rope_theta(cfg),)


class MMaDA(LLaDA):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        require(pub, ["llm_vocab_size", "codebook_size"], "mmada")
        for key, value in _FIXED.items():
            if key in pub and pub[key] != value:
                raise UserError(f"mmada config.json: {key}={pub[key]!r} is not supported (the published MMaDA "
                                f"has {value!r}); this adapter maps the layout onto a stock Llama")
        hf = super().hf_config(pub)
        text, codes = int(pub["llm_vocab_size"]), int(pub["codebook_size"])
        if text + codes > hf.vocab_size:
            raise UserError(f"mmada config.json: llm_vocab_size {text} + codebook_size {codes} exceed the "
                            f"{hf.vocab_size} embedding rows (vocab_size / embedding_size); fix the sizes")
        return hf

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        if base and _shape(self.hf_config(base)) == _shape(hf):
            return {**base, "model_type": self.model_type, "architectures": list(self.architectures)}
        pub = super().published_config(hf, base)
        if not self.auto_map:  # the published MMaDA config has none (its code is imported, not hub-loaded)
            pub.pop("auto_map", None)
        return pub

    def tiny(self, **kw: Any) -> dict[str, Any]:
        """LLaDA's tiny config with the vocabulary split in half: text ids, then image codes."""
        pub = super().tiny(**kw)
        pub.pop("auto_map", None)
        vocab = int(pub["vocab_size"])
        pub.update(llm_vocab_size=vocab // 2, codebook_size=vocab - vocab // 2, new_vocab_size=vocab, **_FIXED)
        return pub


MMADA = MMaDA(
    name="mmada", attention="full", shift=False, mask_token_id=126336, eos_token_id=126081, pad_token_id=126081,
    model_type="mmada", architectures=("MMadaModelLM",), mask_token="<|mdm_mask|>",
)
