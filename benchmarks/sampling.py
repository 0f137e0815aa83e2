"""Sampling benchmark: tokens/s, NFE and peak memory per decoding mode, and the ratios measured side by side.

    .venv/bin/python benchmarks/sampling.py            # full: 4 layers, hidden 256, prompt 64, gen 256 (CPU)
    .venv/bin/python benchmarks/sampling.py --quick    # smoke run (seconds)

Ratios (targets in brackets): block model (block 4) cache vs no cache [>= 3x tok/s]; full attention (block 32)
prefix vs none [>= 2x] and dual vs none [>= 3x]; batch 32 vs the same 32 prompts one at a time [>= 5x];
dynamic threshold 0.9 vs static one token per step: NFE ratio; continuous batching (``dllm_rl.sampling.engine``) vs
fixed batches of the same width on the shipped demo models (LLaDA's also with Fast-dLLM's dual cache), rollout
settings (temperature 1, threshold 0.9, EOS stops), answer tokens/s at equal tokens (the two give the same tokens;
the run checks it) [>= 2x, issue 37], and with
the engine's early stop (same answers, fewer steps), with the engine's KV pool (its whole KV memory: a step reads
the pool in place); the engine on a block model with 4 query heads per key/value head, grouped-query attention
read in place (``dllm_rl.models.attention``) vs transformers' SDPA, which repeats the keys (same tokens, tok/s);
the block demo's RL step beside a process that keeps one core
busy, at two threads and at the count ``dllm_rl.threads`` chooses [busy / idle <= 2x, issue 37]. Decoding is greedy
with one token per step (static) unless stated; ``stop_on_eos`` is off so every mode decodes the same number of
tokens. Models are random; the dynamic-threshold model has its LM head scaled up so its confidences spread over
(0, 1) like a trained model's (a random model is never 90% sure of anything). Each mode runs once per round, rounds
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
import json
import os
import threading
import time
from pathlib import Path

import torch

import dllm_rl
from dllm_rl.models import build_model, load_model, load_tokenizer, tiny_config
from dllm_rl.sampling import DecodeConfig, generate, generate_batched
from dllm_rl.sampling.engine import Engine, EngineConfig

DEMO = Path(dllm_rl.__file__).parent / "assets" / "demo"


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


def demo_prompts(tokenizer, n: int) -> list[list[int]]:
    """The first ``n`` held-out countdown puzzles as the demo's compact prompts, tokenized."""
    with open(DEMO / "countdown_heldout.jsonl") as fh:
        rows = [json.loads(line) for line in fh][:n]
    texts = [f"nums {' '.join(map(str, r['nums']))} target {r['target']}\n" for r in rows]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def continuous_section(args, n_prompts: int, slots: int, repeats: int) -> None:
    """Continuous batching vs fixed batches of ``slots`` prompts on the demo models (rollout decoding), side by side."""
    print(f"\ncontinuous batching vs fixed batches: demo models, {n_prompts} prompts, {slots} slots = fixed batch "
          f"width, temperature 1, threshold 0.9, EOS stops; answer tokens/s, best of {repeats} interleaved rounds")
    for name, gen, block, cache in (("sdar-countdown", 32, 4, "none"), ("llada-countdown", 16, 16, "none"),
                                    ("llada-countdown", 16, 16, "dual")):
        model = load_model(DEMO / name, device=args.device)
        prompts = demo_prompts(load_tokenizer(DEMO / name), n_prompts)
        cfg = DecodeConfig(gen_length=gen, block_length=block, threshold=0.9, temperature=1.0, cache=cache)
        runs = {"fixed": None, "continuous": EngineConfig(slots=slots),
                "continuous, early stop": EngineConfig(slots=slots, early_stop=True)}
        best, outs = {}, {}
        for _ in range(repeats):
            for key, engine in runs.items():
                t0 = time.perf_counter()
                if engine is None:
                    outs[key] = generate_batched(model, prompts, cfg, batch_size=slots)
                else:
                    runner = Engine(model, cfg, engine)
                    outs[key] = runner.run(prompts)
                if args.device != "cpu":
                    torch.cuda.synchronize()
                best[key] = min(best.get(key, float("inf")), time.perf_counter() - t0)
        fixed, cont, early = outs["fixed"], outs["continuous"], outs["continuous, early stop"]
        same = torch.equal(fixed.completion_ids, cont.completion_ids) and torch.equal(fixed.step_map, cont.step_map)
        same_answers = torch.equal(fixed.completion_mask, early.completion_mask) and torch.equal(
            fixed.completion_ids[fixed.completion_mask], early.completion_ids[early.completion_mask])
        answer_tokens = int(fixed.completion_mask.sum())
        print(f"  {name} (gen {gen}, block {block}, cache {cache}): {answer_tokens} answer tokens; continuous = fixed "
              f"tokens and step maps: {same}; early stop = same answers: {same_answers}")
        for key, out in outs.items():
            print(f"    {key:<24} {best[key]:8.2f}s {answer_tokens / best[key]:9.1f} answer tok/s  "
                  f"mean NFE {out.nfe.float().mean().item():5.2f}  generated {int((out.step_map >= 0).sum())}")
        if runner.cache is not None:  # block models: the KV pool, read in place (never copied per step)
            print(f"    engine KV pool {runner.cache.nbytes() / 2**20:.2f} MiB")
        for key in ("continuous", "continuous, early stop"):
            ratio = best["fixed"] / best[key]
            verdict = "(--quick: targets apply to the full run)" if args.quick else \
                f"target >= 2x: {'ok' if ratio >= 2 else 'MISSED'}"
            print(f"    ratio {key} / fixed, tok/s: {ratio:5.2f}x  {verdict}")


def grouped_section(args, repeats: int) -> None:
    """Grouped-query attention read in place (``dllm_rl.models.attention``) vs transformers' SDPA, which copies each
    key/value head per query head under a mask: the engine decoding a block model with 8B's grouping (4 query heads
    per key head: SDAR-8B, SDAR-MoE, Dream, Fast-dLLM v2), side by side on the same weights."""
    slots, n_prompts, gen = (4, 8, 8) if args.quick else (16, 32, 64)
    print(f"\ngrouped-query attention: block model (8 heads, 2 key/value heads, head dim 64, 2 layers), engine with "
          f"{slots} slots, {n_prompts} prompts, gen {gen}, block 4, greedy; best of {repeats} interleaved rounds")
    cfg = tiny_config("sdar", vocab_size=args.vocab, hidden_size=512, num_layers=2, num_heads=8, num_kv_heads=2,
                      intermediate_size=1024, block_size=4, max_position_embeddings=4096)
    ours = build_model("sdar", cfg, seed=0).to(args.device)
    stock = build_model("sdar", cfg, seed=0).to(args.device)
    stock.hf_model.set_attn_implementation("sdpa")
    decode = DecodeConfig(gen_length=gen, block_length=4, stop_on_eos=False)
    g = torch.Generator().manual_seed(1)
    for prompt_len in (16, 128) if args.quick else (64, 512):
        prompts = [torch.randint(0, args.vocab - 3, (prompt_len,), generator=g).tolist() for _ in range(n_prompts)]
        best, outs = {}, {}
        for _ in range(repeats):
            for key, model in (("transformers SDPA (keys repeated)", stock), ("grouped (keys read once)", ours)):
                t0 = time.perf_counter()
                outs[key] = Engine(model, decode, EngineConfig(slots=slots)).run(prompts)
                if args.device != "cpu":
                    torch.cuda.synchronize()
                best[key] = min(best.get(key, float("inf")), time.perf_counter() - t0)
        a, b = outs.values()
        same = torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.step_map, b.step_map)
        # keys + values, 2 layers, the cached width of a step with every slot at its end
        copied = 2 * 2 * slots * (prompt_len + gen) * (8 - 2) * 64 * ours.dtype.itemsize
        print(f"  prompt {prompt_len}: same tokens and step maps: {same}; a step's repeat copies up to "
              f"{copied / 2**20:.1f} MiB of keys and values")
        for key, seconds in best.items():
            print(f"    {key:<36} {seconds:8.2f}s {n_prompts * gen / seconds:9.1f} tok/s")
        first, second = best.values()
        print(f"    ratio grouped / transformers SDPA, tok/s: {first / second:5.2f}x")


def threads_section(args, steps: int) -> None:
    """Issue 37: the block demo's RL step (the demo config: ESPO, 16 prompts x 8 rollouts) with two intra-op threads
    and with the count ``dllm_rl.threads`` chooses (the cores free when the trainer starts), on the machine as it is
    and beside a busy process that spins on one core; seconds per step (rollout + update), best of ``steps`` after a
    warm-up step. Run it with ``OMP_NUM_THREADS`` unset (it would fix the chosen count)."""
    import subprocess
    import sys
    import tempfile

    from dllm_rl.config import load_config
    from dllm_rl.rl.cli import demo_config_path, demo_overrides
    from dllm_rl.rl.config import RLConfig
    from dllm_rl.rl.trainer import RLTrainer

    def step_seconds(threads: int | None) -> tuple[float, float]:
        with tempfile.TemporaryDirectory() as out:
            cfg = load_config(RLConfig, demo_config_path("block"), [
                *demo_overrides("block"), f"run.output_dir={out}", "run.progress=false", "log.samples_every=0",
                "log.dashboard=false", "eval.limit=0", *([f"train.num_threads={threads}"] if threads else [])])
            trainer = RLTrainer(cfg)
            times = []
            for _ in range(steps + 1):
                m = trainer.step().metrics
                times.append((m["time_rollout"], m["time_update"]))
            return min(times[1:], key=sum)

    print(f"\nthreads on a shared machine: block demo RL step (rollout + update s), best of {steps} after a warm-up; "
          f"{len(os.sched_getaffinity(0))} usable cores")
    rows = {}
    for busy in (False, True):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for label, threads in (("2 threads", 2), ("chosen", None)):
                roll, upd = step_seconds(threads)
                rows[(busy, label)] = roll + upd
                print(f"  {'busy core beside' if busy else 'as it is':<17} {label:<10} ({torch.get_num_threads()} "
                      f"thread(s)): {roll:6.2f} + {upd:6.2f} = {roll + upd:6.2f} s", flush=True)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    for label in ("2 threads", "chosen"):
        ratio = rows[(True, label)] / rows[(False, label)]
        print(f"  {label:<10} busy / as it is: {ratio:5.2f}x  (target <= 2x: {'ok' if ratio <= 2 else 'MISSED'})")


def report(modes: dict, best: dict, checks: list, quick: bool) -> None:
    """The modes' table and the measured ratios against their targets."""
    if modes:
        print(f"\n{'mode':<48} {'wall s':>8} {'cpu s':>8} {'tokens':>7} {'tok/s':>9} {'cpu tok/s':>9} {'NFE':>7} "
              f"{'peak MiB':>9}")
    for key, (label, *_rest) in modes.items():
        row = best[key]
        print(f"{label:<48} {row['seconds']:8.2f} {row['cpu']:8.2f} {row['tokens']:7d} {row['tok_s']:9.1f} "
              f"{row['cpu_tok_s']:9.1f} {row['nfe']:7.1f} {row['peak_mib']:9.1f}")

    if checks:
        print("\nratios (measured in this run; wall-clock, and main-thread CPU time which ignores machine sharing)")
    for name, (a, b, key), target in checks:
        value = best[a][key] / best[b][key]
        if key == "nfe":
            print(f"  {name:<42} {value:6.2f}x")
            continue
        cpu_value = best[a]["cpu_" + key] / best[b]["cpu_" + key]
        verdict = f"  target >= {target:.0f}x: wall {'ok' if value >= target else 'MISSED'}, " \
                  f"cpu {'ok' if cpu_value >= target else 'MISSED'}"
        if quick:
            verdict = "  (--quick: targets apply to the full run)"
        print(f"  {name:<42} {value:6.2f}x wall {cpu_value:6.2f}x cpu{verdict}")


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
    ap.add_argument("--only", default="",
                    help="comma list of sections to run: cache,full,batch,dynamic,continuous,grouped,threads "
                         "(default all)")
    ap.add_argument("--slots", type=int, default=32,
                    help="continuous section: engine slots = fixed batch width (default 32; --quick 8)")
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

    sections = set(args.only.split(",")) if args.only else {"cache", "full", "batch", "dynamic", "continuous",
                                                              "grouped", "threads"}
    sdar, llada = tiny("sdar", args), tiny("llada", args)
    if sections & {"cache", "full", "batch", "dynamic"}:
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
    report(modes, best, checks, args.quick)
    if "continuous" in sections:
        continuous_section(args, 32 if args.quick else 256, 8 if args.quick else args.slots, repeats)
    if "grouped" in sections:
        grouped_section(args, repeats)
    if "threads" in sections:
        threads_section(args, 1 if args.quick else 3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
