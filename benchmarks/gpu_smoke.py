"""The first thing to run on a machine with a GPU: 2 RL steps of TraceRL and of ESPO in bf16 on random models
of real shapes, through the real trainer (``dllm_rl.rl.trainer.train``), with the throughput and peak memory.

    python benchmarks/gpu_smoke.py                 # SDAR-4B-shaped (+ LLaDA-8B-shaped with >= 100 GiB free)
    python benchmarks/gpu_smoke.py --tiny          # the same on CPU at a tiny size (what CI runs)

Each model is built with random weights directly on the device in bf16 (no hub, no download), written once
to a temporary folder (the trainer reads a checkpoint folder), then trained 2 steps per algorithm on synthetic
countdown prompts with a dense reward (no group is dropped). One line per run::

    RESULT sdar-4b tracerl rollout_tokens_per_s=... update_tokens_per_s=... peak_memory_gib=...

Then, for block models, the continuous-batching engine against fixed batches of the same width (issue 37's
figure, whose regime is a device: there a forward costs about the same with 8 rows or 32, so a fixed batch whose
rows finished early wastes its width), one line::

    RESULT sdar-4b engine fixed_tokens_per_s=... continuous_tokens_per_s=... continuous_over_fixed=... ...

decoded with threshold 0.9 and EOS stops at temperature 1 on the same random model, its LM head scaled up so that
its confidences spread (a random model is never 90% sure of anything) and its most frequent token taken as EOS, so
rows stop after different numbers of blocks. Then one cached step's attention with grouped query heads, as
``dllm_rl.models.attention`` runs it against transformers' SDPA (which repeats each key/value head per query head
under a mask), at the model's head shape, ``slots`` rows of ``cached`` positions, a block of queries, one line::

    RESULT sdar-4b attention grouped_ms=... repeated_ms=... grouped_over_repeated=... max_abs_diff=...

``same_rows``: the share of rows whose tokens the two agree on (1 on a
CPU in float32; in bfloat16 on a GPU, kernels chosen by batch width may differ in the last bits and flip a
near-tied choice).

rollout tokens/s: completion tokens decoded per second of rollout (the trainer's ``rollout_tokens_per_s``);
update tokens/s: completion tokens scored and back-propagated per second of update (``kept_samples x
completion length / time_update``, all optimisation passes); peak memory: ``torch.cuda.max_memory_allocated``
over the run (CPU: the process's peak resident set size). Figures of the 2nd step (the 1st warms up kernels).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from dllm_rl.config import load_config
from dllm_rl.jsonl import write_jsonl
from dllm_rl.models import DiffusionLM, build_model, char_tokenizer, load_model, load_tokenizer, save_model, tiny_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train
from dllm_rl.sampling import DecodeConfig, generate_batched
from dllm_rl.sampling.engine import Engine, EngineConfig
from dllm_rl.tasks.synthetic import make_countdown

# name: (family, tiny_config sizes). Shapes of the published checkpoints (SDAR-4B-Chat is Qwen3-4B-shaped,
# LLaDA-8B-Instruct Llama-shaped); the char tokenizer covers the prompts, the rest of the vocabulary is unused.
SHAPES = {
    "sdar-4b": ("sdar", dict(vocab_size=151_936, hidden_size=2560, num_layers=36, num_heads=32, num_kv_heads=8,
                             intermediate_size=9728, block_size=4, max_position_embeddings=4096)),
    "llada-8b": ("llada", dict(vocab_size=126_464, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                               intermediate_size=12_288, max_position_embeddings=4096)),
    "tiny-sdar": ("sdar", dict(vocab_size=512, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                               intermediate_size=64, block_size=4)),
}
LLADA_8B_MIN_FREE_GIB = 100  # bf16 weights + grads + AdamW states (~64 GiB) + activations and rollouts


def dense_reward(prompts, completions, **columns):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) + sum(map(ord, c)) % 13 / 100 for c in completions]


def write_model(name: str, folder: Path, device: str, dtype: str) -> Path:
    family, sizes = SHAPES[name]
    tok = char_tokenizer()
    cfg = tiny_config(family, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, **sizes)
    with torch.device(device):  # random init on the device: minutes faster than on the CPU at 4-8B
        dlm = build_model(family, cfg, seed=0, dtype=dtype)
    save_model(dlm.to("cpu"), folder / name, tokenizer=tok)  # safetensors writes host tensors
    del dlm
    if device == "cuda":
        torch.cuda.empty_cache()
    return folder / name


def peak_memory_gib(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def run(model: Path, data: Path, out: Path, algorithm: str, args) -> dict[str, float]:
    overrides = [f"algorithm={algorithm}", f"model.path={model}", "data.task=countdown", f"data.train_file={data}",
                 "data.prompt_style=compact", f"train.prompts_per_step={args.prompts}",
                 f"rollout.num_generations={args.generations}",
                 f"rollout.gen_length={args.gen_length}", f"rollout.block_length={args.block_length}",
                 f"rollout.batch_size={args.prompts * args.generations}", "eval.limit=0", "train.max_steps=2",
                 f"train.micro_batch_size={args.micro_batch}", "optim.lr=1e-6", f"model.device={args.device}",
                 f"model.dtype={args.dtype}", "run.progress=false", "log.samples_every=0", "run.save_every=0",
                 f"run.output_dir={out}", "run.overwrite=true"]
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    train(load_config(RLConfig, None, overrides), reward_fn=dense_reward)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "time_update" in r][-1]
    update = last["kept_samples"] * last["completion_length"] / max(last["time_update"], 1e-9)
    return {"rollout_tokens_per_s": last["rollout_tokens_per_s"], "update_tokens_per_s": update,
            "peak_memory_gib": peak_memory_gib(args.device)}


def engine_comparison(model_dir: Path, prompts: list[str], args) -> dict[str, float]:
    """Answer tokens/s of fixed batches of ``args.slots`` prompts and of the engine with as many slots, the ratio,
    the share of rows the two agree on, and the rows' NFE range."""
    model = load_model(model_dir, dtype=args.dtype, device=args.device)
    with torch.no_grad():
        model.model.lm_head.weight.mul_(args.sharpen)
    tokenizer = load_tokenizer(model_dir)
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    config = DecodeConfig(gen_length=args.decode_length, threshold=0.9, temperature=1.0)
    free = generate_batched(model, ids[: args.slots], dataclasses.replace(config, stop_on_eos=False),
                            batch_size=args.slots)
    eos = int(torch.bincount(free.completion_ids[free.step_map >= 0].flatten().cpu()).argmax())
    model = DiffusionLM(model.model, model.family, {**model.published_config, "eos_token_id": eos})
    modes = {"fixed": lambda: generate_batched(model, ids, config, batch_size=args.slots),
             "continuous": lambda: Engine(model, config, EngineConfig(slots=args.slots)).run(ids)}
    best, out = {}, {}
    for _ in range(3):  # best of three interleaved rounds (the first also warms up)
        for name, fn in modes.items():
            sync(args.device)
            t0 = time.perf_counter()
            out[name] = fn()
            sync(args.device)
            best[name] = min(best.get(name, math.inf), time.perf_counter() - t0)
    tokens = int(out["fixed"].completion_mask.sum())
    same = (out["fixed"].completion_ids == out["continuous"].completion_ids).all(-1).float().mean()
    nfe = out["fixed"].nfe.float()
    return {"fixed_tokens_per_s": tokens / best["fixed"], "continuous_tokens_per_s": tokens / best["continuous"],
            "continuous_over_fixed": best["fixed"] / best["continuous"], "same_rows": float(same),
            "nfe_min": float(nfe.min()), "nfe_mean": float(nfe.mean()), "nfe_max": float(nfe.max())}


def attention_comparison(name: str, args) -> dict[str, float]:
    """Milliseconds per call of one layer's masked attention of a cached block step, grouped and repeated (best of 20
    after a warm-up), their ratio and the largest difference of their outputs."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from dllm_rl.models.attention import grouped_sdpa

    sizes = SHAPES[name][1]
    heads, kv_heads = sizes["num_heads"], sizes["num_kv_heads"]
    dim, block, cached = sizes["hidden_size"] // heads, sizes["block_size"], args.cached
    layer = torch.nn.Module()
    layer.num_key_value_groups, layer.is_causal = heads // kv_heads, False
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(args.device).manual_seed(0)
    q = torch.randn(args.slots, heads, block, dim, generator=g, device=args.device, dtype=dtype)
    k, v = (torch.randn(args.slots, kv_heads, cached + block, dim, generator=g, device=args.device, dtype=dtype)
            for _ in range(2))
    lengths = torch.randint(cached // 2, cached + 1, (args.slots,), generator=g, device=args.device)
    cols = torch.arange(cached + block, device=args.device)
    keep = (cols < lengths[:, None]) | (cols >= cached)  # each row's cached positions, then its block
    mask = torch.zeros(args.slots, 1, block, cached + block, device=args.device, dtype=dtype)
    mask.masked_fill_(~keep[:, None, None, :], torch.finfo(dtype).min)
    times, outs = {}, {}
    for key, fn in (("grouped", grouped_sdpa), ("repeated", sdpa_attention_forward)):
        outs[key] = fn(layer, q, k, v, mask)[0]
        runs = []
        for _ in range(20):
            sync(args.device)
            t0 = time.perf_counter()
            fn(layer, q, k, v, mask)
            sync(args.device)
            runs.append(time.perf_counter() - t0)
        times[key] = min(runs) * 1e3
    return {"grouped_ms": times["grouped"], "repeated_ms": times["repeated"],
            "grouped_over_repeated": times["repeated"] / times["grouped"],
            "max_abs_diff": float((outs["grouped"].float() - outs["repeated"].float()).abs().max())}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="CPU, tiny model, short rollouts (CI)")
    p.add_argument("--models", nargs="*", default=None, help=f"of {', '.join(SHAPES)}")
    p.add_argument("--algorithms", nargs="*", default=["tracerl", "espo"])
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    args.device, args.dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    args.prompts, args.generations = (4, 8) if cuda else (1, 4)
    args.gen_length, args.block_length, args.micro_batch = (256, 32, 8) if cuda else (8, 8, 4)
    # the engine comparison: prompts, slots (= the fixed batch), completion length, LM-head scale
    args.engine_prompts, args.slots, args.decode_length, args.sharpen = (128, 32, 256, 8.0) if cuda else \
        (16, 4, 16, 40.0)
    args.cached = 2048 if cuda else 64  # the attention comparison's cached positions per slot
    if args.models is None:
        args.models = ["tiny-sdar"] if not cuda else ["sdar-4b"]
        if cuda and torch.cuda.mem_get_info()[0] / 2**30 >= LLADA_8B_MIN_FREE_GIB:
            args.models.append("llada-8b")
    if not cuda and not args.tiny:
        print("gpu_smoke: no CUDA device; running the tiny CPU size (pass --tiny to silence this)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_jsonl(tmp / "train.jsonl", make_countdown(64, seed=0, numbers=3, max_value=9))
        for name in args.models:
            t0 = time.perf_counter()
            model = write_model(name, tmp, args.device, args.dtype)
            print(f"gpu_smoke: built {name} in {time.perf_counter() - t0:.1f} s", flush=True)
            for algorithm in args.algorithms:
                r = run(model, tmp / "train.jsonl", tmp / f"run-{name}-{algorithm}", algorithm, args)
                bad = [k for k, v in r.items() if not math.isfinite(v)]
                print(f"RESULT {name} {algorithm} " + " ".join(f"{k}={v:.3f}" for k, v in r.items()), flush=True)
                if bad:
                    print(f"gpu_smoke: {name} {algorithm}: non-finite {bad}", file=sys.stderr)
                    return 1
            if SHAPES[name][0] == "sdar":
                prompts = [f"nums {' '.join(map(str, row['nums']))} target {row['target']}\n"  # the compact style
                           for row in make_countdown(args.engine_prompts, seed=1, numbers=3, max_value=9)]
                r = engine_comparison(model, prompts, args)
                print(f"RESULT {name} engine " + " ".join(f"{k}={v:.3f}" for k, v in r.items()), flush=True)
                r = attention_comparison(name, args)
                print(f"RESULT {name} attention " + " ".join(f"{k}={v:.4g}" for k, v in r.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
