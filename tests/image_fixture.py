"""Tiny checkpoints of both image families (imported by name by the RL and SFT tests' fixtures)."""

from __future__ import annotations

from pathlib import Path

import torch

from dllm_rl.models import build_model, save_model, tiny_config
from dllm_rl.models.image_inputs import save_vq
from dllm_rl.models.magvit import MagvitConfig, MagvitEncoder

#: a "pad" image of the tiny LLaDA-V: 729 patches + one newline
LLADA_V_IMAGE_POSITIONS = 730
#: the tiny MMaDA's codes per image (16 px through 2 levels: 8 x 8)
MMADA_CODES = 64


def write_image_checkpoints(root: Path, tok) -> None:
    """``root/llada_v`` (``pad`` images, 730 prompt positions) and ``root/mmada`` (a text vocabulary of 126464,
    then 32 image codes; a tiny MAGVIT-v2 encoder, 16 px -> 64 codes, in its ``vq_model/`` folder), both width 16,
    one layer, sized to the character tokenizer ``tok``."""
    common = dict(mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  hidden_size=16, intermediate_size=32, num_heads=2, num_kv_heads=1, num_layers=1)
    cfg = tiny_config("llada_v", vocab_size=len(tok), **common)
    cfg["image_aspect_ratio"] = "pad"
    save_model(build_model("llada_v", cfg, seed=0), root / "llada_v", tokenizer=tok)
    cfg = tiny_config("mmada", vocab_size=126464 + 32, **common)
    cfg.update(llm_vocab_size=126464, codebook_size=32, new_vocab_size=126464 + 32)
    save_model(build_model("mmada", cfg, seed=0), root / "mmada", tokenizer=tok)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        vq = MagvitEncoder(MagvitConfig(ch=32, ch_mult=(1, 2), num_res_blocks=(1, 1), z_channels=5)).eval()
    save_vq(vq, root / "mmada" / "vq_model", resolution=16)
