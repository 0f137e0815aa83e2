"""Tiny reward models and judges written in the test, in the layout of the common open ones (nothing from a hub)."""

from __future__ import annotations

import torch

from dllm_rl.models import char_tokenizer

#: the role markup of a Llama-3-style reward model's chat template (character-level here)
RM_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
#: a judge's chat template: the user turn in brackets, then the generation prompt
JUDGE_TEMPLATE = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}>"


def tiny_llama(path, cls_name: str = "LlamaForSequenceClassification", seed: int = 0, chat_template: str = RM_TEMPLATE,
               layers: int = 2):
    """A tiny Llama saved at ``path`` with a character tokenizer: a reward model (``num_labels=1``, a head named
    ``score``, as the common open reward models are published) or, with ``LlamaForCausalLM``, a judge."""
    import transformers
    from transformers import LlamaConfig

    tok = char_tokenizer(chat_template=chat_template)
    conf = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024, num_labels=1,
                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    getattr(transformers, cls_name)(conf).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def constant_reward(prompts, completions, **columns):
    """A custom reward in TRL's signature for config checks: 1 for every completion."""
    return [1.0] * len(completions)
