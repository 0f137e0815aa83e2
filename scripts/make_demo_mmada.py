"""Write the untrained start of the MMaDA vision demo (src/dllm_rl/assets/demo/mmada-shapes), which
`dllm-rl sft configs/demo-sft-mmada.yaml` then trains on the shapes task (src/dllm_rl/assets/demo/README.md).

`dllm-rl sft` builds fresh models of the text families and LLaDA-V only; an MMaDA model needs its MAGVIT-v2 VQ
encoder beside it (``vq_model/``) and a vocabulary that reaches the published understanding ids (``<|mmu|>``
126089), so this script lays out the tiny one: the vision demo's character tokenizer (its answer words one token
each), a 2-layer model of width 16 whose input and output embeddings are shared (126,096 rows: the text ids, then
32 image codes), and a seeded, untrained VQ encoder that turns a 48 px scene into 6 x 6 codes (one downsampling
per level after the first, 5 bits per code).

    python scripts/make_demo_mmada.py init runs/demo-mmada-init
    dllm-rl sft configs/demo-sft-mmada.yaml   (and a second run from its model: src/dllm_rl/assets/demo/README.md)
    python scripts/make_demo_mmada.py pack runs/demo-sft-mmada-2/model src/dllm_rl/assets/demo/mmada-shapes

``pack`` writes the trained model in bfloat16 (4 MB instead of 8; it loads as float32) with its tokenizer and VQ
encoder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dllm_rl.models import build_model, load_tokenizer, save_model, tiny_config
from dllm_rl.models.image_inputs import save_vq
from dllm_rl.models.magvit import MagvitConfig, MagvitEncoder

DEMO = Path(__file__).resolve().parents[1] / "src" / "dllm_rl" / "assets" / "demo"
CODES, TEXT_ROWS = 32, 126_064  # image codes (2 ** z_channels); text rows, past <|mmu|> (126089) with the codes
RESOLUTION = 48  # the shapes task's scenes, unresized


def init(out: Path) -> None:
    tok = load_tokenizer(DEMO / "llada_v-shapes")  # the vision demo's character tokenizer and chat template
    cfg = tiny_config("mmada", vocab_size=TEXT_ROWS + CODES, hidden_size=16, intermediate_size=64, num_heads=2,
                      num_kv_heads=2, num_layers=2, max_position_embeddings=128, tie_word_embeddings=True,
                      mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    cfg.update(llm_vocab_size=TEXT_ROWS, codebook_size=CODES, new_vocab_size=TEXT_ROWS + CODES)
    save_model(build_model("mmada", cfg, seed=0), out, tokenizer=tok)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        vq = MagvitEncoder(MagvitConfig(ch=32, ch_mult=(1, 1, 1, 1), num_res_blocks=(1, 1, 1, 1), z_channels=5))
    save_vq(vq.eval(), out / "vq_model", resolution=RESOLUTION)
    print(f"wrote {out}")


def pack(src: Path, out: Path) -> None:
    from dllm_rl.models import load_model
    from dllm_rl.models.image_inputs import copy_vq

    model = load_model(src)
    save_model(model, out, tokenizer=load_tokenizer(src, mask_token_id=model.mask_token_id), dtype="bfloat16")
    copy_vq(src, out)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="write the untrained model and VQ encoder").add_argument("out")
    p = sub.add_parser("pack", help="write a trained model in bfloat16 with its tokenizer and VQ encoder")
    p.add_argument("src")
    p.add_argument("out")
    args = parser.parse_args()
    if args.command == "init":
        init(Path(args.out))
    else:
        pack(Path(args.src), Path(args.out))


if __name__ == "__main__":
    main()
