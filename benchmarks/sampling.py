"""Sampling benchmark: tokens/s, NFE and peak memory per decoding mode, and the ratios measured side by side.

    .venv/bin/python benchmarks/sampling.py            # full: 4 layers, hidden 256, prompt 64, gen 256 (CPU)
    .venv/bin/python benchmarks/sampling.py --quick    # smoke run (seconds)

Ratios (targets in brackets): block model (block 4) cache vs no cache [>= 3x tok/s]; full attention (block 32)
prefix vs none [>= 2x] and dual vs none [>= 3x]; batch 32 vs the same 32 prompts one at a time [>= 5x];
dynamic threshold 0.9 vs static one token per step: NFE ratio. Decoding is greedy with one token per step
(static) unless stated; ``stop_on_eos`` is off so every mode decodes the same number of tokens. Models are
random; the dynamic-threshold model has its LM head scaled up so its confidences spread over (0, 1) like a
trained model's (a random model is never 90% sure of anything). Each mode runs once per round, rounds
interleave the modes, and the best time of the rounds is kept; tok/s is reported against wall-clock time and
against the main thread's CPU time (with one torch thread all compute runs there, so it ignores the machine's
other tenants). Peak memory: peak CUDA allocation, or on CPU
the peak resident-set growth during the run (sampled every 2 ms, after handing freed heap pages back to
the OS with glibc ``malloc_trim``; includes allocator slack, so read it as an upper bound).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import threading
import time

import torch

from dllm_rl.models import build_model, tiny_config
from dllm_rl.sampling import DecodeConfig, generate


class PeakMemory:
    """Peak memory growth (MiB) inside the ``with`` block: CUDA allocator peak, else sampled RSS."""

    def __init__(self, device: torch.device):
        self.device, self.peak_mib = device, 0.0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._max = max(self._max, self._rss())
            time.sleep(0.002)

    @staticmethod
    def _release_free_memory() -> None:
        """Hand freed heap pages back to the OS (glibc ``malloc_trim``) so the next run's growth shows in RSS."""
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._release_free_memory()
            self._base = self._max = self._rss()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()
            peak = max(self._max, self._rss())
        self.peak_mib = (peak - self._base) / 2**20


def tiny(family: str, args, sharp: bool = False):
    cfg = tiny_config(family, vocab_size=args.vocab, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=4,
                      intermediate_size=512, block_size=4, max_position_embeddings=4096)
    model = build_model(family, cfg, seed=0, attn_implementation=args.attn).to(args.device)
    if sharp:
        with torch.no_grad():
            model.model.lm_head.weight.mul_(60.0)
    return model


def measure(model, prompts, config: DecodeConfig, one_at_a_time: bool = False, **kw) -> dict:
    """One timed run: seconds, generated tokens, mean NFE per sequence, peak memory growth."""
    device = torch.device(model.device)
    with PeakMemory(device) as mem:
        t0, c0 = time.perf_counter(), time.thread_time()
        if one_at_a_time:
            outs = [generate(model, [p], config, seeds=[i], **kw) for i, p in enumerate(prompts)]
            tokens = sum(int((o.step_map >= 0).sum()) for o in outs)
            nfe = torch.cat([o.nfe for o in outs]).float()
        else:
            out = generate(model, prompts, config, **kw)
            tokens, nfe = int((out.step_map >= 0).sum()), out.nfe.float()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return {"seconds": seconds, "cpu": cpu, "tokens": tokens, "tok_s": tokens / seconds, "cpu_tok_s": tokens / cpu,
            "nfe": nfe.mean().item(), "peak_mib": mem.peak_mib}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small smoke run: prompt 16, gen 32, fewer prompts")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: steady numbers on a shared machine; 0 = torch default)")
    ap.add_argument("--batch", type=int, default=4, help="prompts per batch for the cache comparisons (default 4)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="rounds; each mode runs once per round (modes interleaved) and keeps its best time")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"), help="attention kernel (default sdpa)")
    ap.add_argument("--only", default="", help="comma list of sections to run: cache,full,batch,dynamic (default all)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    prompt_len, gen, n_many = (16, 32, 8) if args.quick else (64, 256, 32)
    batch = min(args.batch, 2) if args.quick else args.batch
    repeats = 1 if args.quick else max(1, args.repeats)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, args.vocab - 3, (prompt_len,), generator=g).tolist() for _ in range(n_many)]
    print(f"device {args.device}, threads {torch.get_num_threads()}, attention {args.attn}, 4 layers, hidden 256, "
          f"vocab {args.vocab}, prompt {prompt_len}, gen {gen}, batch {batch} (batch test: {n_many} prompts), "
          f"best of {repeats} interleaved rounds")

    sections = set(args.only.split(",")) if args.only else {"cache", "full", "batch", "dynamic"}
    sdar, llada = tiny("sdar", args), tiny("llada", args)
    generate(sdar, prompts[:1], DecodeConfig(gen_length=8))  # warm-up
    generate(llada, prompts[:1], DecodeConfig(gen_length=8, block_length=8))
    static = DecodeConfig(gen_length=gen, stop_on_eos=False)  # one token per step
    few = prompts[:batch]
    modes: dict[str, tuple] = {}  # key -> (label, model, prompts, config, kwargs)
    checks = []
    if "cache" in sections:
        modes["blk_none"] = (f"block model, block 4, no cache (B={batch})", sdar, few, static, {"block_cache": False})
        modes["blk_cache"] = (f"block model, block 4, cache (B={batch})", sdar, few, static, {})
        checks.append(("block model: cache vs no cache, tok/s", ("blk_cache", "blk_none", "tok_s"), 3.0))
    if "full" in sections:
        for cache in ("none", "prefix", "dual"):
            cfg = DecodeConfig(gen_length=gen, block_length=32, cache=cache, stop_on_eos=False)
            modes[f"full_{cache}"] = (f"full attention, block 32, cache={cache} (B={batch})", llada, few, cfg, {})
        checks.append(("full attention: prefix vs none, tok/s", ("full_prefix", "full_none", "tok_s"), 2.0))
        checks.append(("full attention: dual vs none, tok/s", ("full_dual", "full_none", "tok_s"), 3.0))
    if "batch" in sections:
        modes["one"] = (f"block model, cache, {n_many} prompts one at a time", sdar, prompts, static,
                        {"one_at_a_time": True})
        modes["batch"] = (f"block model, cache, {n_many} prompts in one batch", sdar, prompts, static, {})
        checks.append((f"batch {n_many} vs one at a time, tok/s", ("batch", "one", "tok_s"), 5.0))
    if "dynamic" in sections:
        sharp = tiny("sdar", args, sharp=True)
        dyn = DecodeConfig(gen_length=gen, threshold=0.9, stop_on_eos=False)
        modes["static1"] = (f"sharp block model, static 1 token/step (B={batch})", sharp, few, static, {})
        modes["dyn"] = (f"sharp block model, dynamic threshold 0.9 (B={batch})", sharp, few, dyn, {})
        checks.append(("static 1 token/step vs dynamic 0.9, NFE", ("static1", "dyn", "nfe"), None))

    best: dict[str, dict] = {}
    for r in range(repeats):
        for key, (label, model, batch_prompts, cfg, kw) in modes.items():
            row = measure(model, batch_prompts, cfg, **kw)
            print(f"  round {r + 1}: {label:<48} {row['seconds']:8.2f}s wall {row['cpu']:8.2f}s cpu", flush=True)
            old = best.setdefault(key, row)
            best[key] = {**old, **{k: row[k] for k in ("seconds", "tok_s") if row["seconds"] < old["seconds"]},
                         **{k: row[k] for k in ("cpu", "cpu_tok_s") if row["cpu"] < old["cpu"]},
                         "peak_mib": max(old["peak_mib"], row["peak_mib"])}
    print(f"\n{'mode':<48} {'wall s':>8} {'cpu s':>8} {'tokens':>7} {'tok/s':>9} {'cpu tok/s':>9} {'NFE':>7} "
          f"{'peak MiB':>9}")
    for key, (label, *_rest) in modes.items():
        row = best[key]
        print(f"{label:<48} {row['seconds']:8.2f} {row['cpu']:8.2f} {row['tokens']:7d} {row['tok_s']:9.1f} "
              f"{row['cpu_tok_s']:9.1f} {row['nfe']:7.1f} {row['peak_mib']:9.1f}")

    print("\nratios (measured in this run; wall-clock, and main-thread CPU time which ignores machine sharing)")
    for name, (a, b, key), target in checks:
        value = best[a][key] / best[b][key]
        if key == "nfe":
            print(f"  {name:<42} {value:6.2f}x")
            continue
        cpu_value = best[a]["cpu_" + key] / best[b]["cpu_" + key]
        verdict = f"  target >= {target:.0f}x: wall {'ok' if value >= target else 'MISSED'}, " \
                  f"cpu {'ok' if cpu_value >= target else 'MISSED'}"
        if args.quick:
            verdict = "  (--quick: targets apply to the full run)"
        print(f"  {name:<42} {value:6.2f}x wall {cpu_value:6.2f}x cpu{verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
