"""SFT step throughput: our objective's forward+backward vs a plain forward+backward of the stock HF model.

    python benchmarks/sft.py                      # CPU, small LLaDA-shaped model
    python benchmarks/sft.py --hidden 512 --layers 8 --seq 512 --device cuda

Both sides see the same token batch ``[B, prompt + response]``. "stock" is ``hf_model(input_ids,
labels=input_ids)`` + ``backward()`` (transformers' own causal-LM loss, default mask). "ours" is the
trainer's micro-step: :func:`dllm_rl.sft.objectives.compute_objective` (masking plan, attention bias, model
forward, float32 log-softmax at the scored positions, loss) + ``backward()``. Timings are interleaved
(ours/stock pairs run back to back, alternating which goes first) and the overhead is the median of the
per-pair time ratios, which is robust to load drifting over the run on shared CPUs; tokens/s are medians. The acceptance
bar is overhead <= 15% for ``random_mask``; ``block`` on a block model runs the two-stream layout (prompt +
2 x response columns) and is shown for information.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dllm_rl.models import build_model, tiny_config
from dllm_rl.sft.data import SFTExample, collate
from dllm_rl.sft.objectives import compute_objective


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench(family: str, objective: str, args: argparse.Namespace) -> dict[str, float]:
    pub = tiny_config(family, vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                      num_heads=args.heads, num_kv_heads=args.heads, intermediate_size=3 * args.hidden,
                      max_position_embeddings=4 * args.seq)
    dlm = build_model(family, pub, seed=0)
    dlm.to(args.device)
    dlm.train()
    g = torch.Generator().manual_seed(0)
    prompt_len = args.seq // 4
    exs = [SFTExample(torch.randint(0, args.vocab - 2, (prompt_len,), generator=g).tolist(),
                      torch.randint(0, args.vocab - 2, (args.seq - prompt_len,), generator=g).tolist())
           for _ in range(args.batch)]
    batch = collate(exs, dlm.pad_token_id)
    ids = batch.input_ids().to(args.device)
    options = {"block_size": args.block} if objective == "block" and not dlm.is_block_causal else {}
    mask_gen = torch.Generator().manual_seed(1)

    def ours() -> None:
        out = compute_objective(objective, dlm, batch, mask_gen, **options)
        out.loss.backward()

    def stock() -> None:
        out = dlm.model(input_ids=ids, labels=ids)
        out.loss.backward()

    times: dict[str, list[float]] = {"ours": [], "stock": []}
    for i in range(args.warmup + args.iters):
        order = (("ours", ours), ("stock", stock)) if i % 2 == 0 else (("stock", stock), ("ours", ours))
        for name, fn in order:
            dlm.zero_grad(set_to_none=True)
            _sync(args.device)
            t0 = time.perf_counter()
            fn()
            _sync(args.device)
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    tokens = ids.numel()
    med = {k: statistics.median(v) for k, v in times.items()}
    # each pair ran back to back, so its ratio is robust to load drifting over the run (shared CPUs)
    ratio = statistics.median(o / s for o, s in zip(times["ours"], times["stock"]))
    return {"ours_tok_s": tokens / med["ours"], "stock_tok_s": tokens / med["stock"], "overhead": ratio - 1.0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=256, help="prompt + response tokens per row (prompt = seq/4)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=32, help="block length of the sliced block objective")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"device {args.device}, {args.threads} threads; batch {args.batch} x {args.seq} tokens; hidden "
          f"{args.hidden}, {args.layers} layers, vocab {args.vocab}; median of {args.iters} interleaved steps")
    print(f"{'family':<7} {'objective':<12} {'ours tok/s':>11} {'stock tok/s':>12} {'overhead':>9}  gate")
    cases = [("llada", "random_mask", True), ("dream", "random_mask", True), ("llada", "block", False),
             ("sdar", "block", False)]
    for family, objective, gated in cases:
        r = bench(family, objective, args)
        if gated:
            gate = ("PASS" if r["overhead"] <= 0.15 else "FAIL") + " (<= 15%)"
        else:
            gate = "info (two-stream: prompt + 2 x response columns)" if family == "sdar" else "info (sliced block)"
        print(f"{family:<7} {objective:<12} {r['ours_tok_s']:>11.0f} {r['stock_tok_s']:>12.0f} "
              f"{100 * r['overhead']:>8.1f}%  {gate}")


if __name__ == "__main__":
    main()
