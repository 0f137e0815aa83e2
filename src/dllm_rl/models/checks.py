"""Checks that a checkpoint and a tokenizer belong together, made from their files before any weights load."""

from __future__ import annotations

from pathlib import Path

from dllm_rl.errors import UserError


def check_model_tokenizer(model_dir: Path, tokenizer_dir: Path):
    """Load the tokenizer and check it against the checkpoint's config.json (no weights loaded yet):
    mask and EOS ids must agree and every token id must fit the embedding."""
    from dllm_rl.models import load_tokenizer
    from dllm_rl.models.families import detect_family, resolve_mask_token_id
    from dllm_rl.models.loading import read_config, read_generation_config

    pub = read_config(model_dir)
    fam = detect_family(pub, str(model_dir / "config.json"))
    hf = fam.hf_config(pub)
    mask_id = resolve_mask_token_id(pub, fam, model_dir / "config.json", tokenizer_dir)
    eos_ids = fam.eos_ids_of(pub, read_generation_config(model_dir))  # an id or a list (Gemma's)
    tok = load_tokenizer(tokenizer_dir, mask_token_id=mask_id, noise=fam.noise)  # raises on a mask id mismatch
    vocab = int(hf.get_text_config().vocab_size)  # an image-text config (llada_v) holds it in its text config
    if len(tok) > vocab:
        raise UserError(f"tokenizer {tokenizer_dir} has {len(tok)} tokens but the model {model_dir} embeds only "
                         f"{vocab}; tokenizer and model do not belong together")
    if tok.eos_token_id not in eos_ids:
        shown = eos_ids[0] if len(eos_ids) == 1 else list(eos_ids)
        raise UserError(f"tokenizer {tokenizer_dir} eos id {tok.eos_token_id} != model eos_token_id {shown} "
                         f"({model_dir}/config.json); tokenizer and model do not belong together")
    block_size = int(pub.get("block_size") or fam.block_size or 4) if fam.attention == "block" else None
    return tok, fam, block_size
