"""Serving benchmark: `dllm-rl serve` under 1, 8 and 32 concurrent clients, against the same requests sent one at a
time, in one run.

    .venv/bin/python benchmarks/serve.py            # 64 requests on the shipped block demo model (CPU)
    .venv/bin/python benchmarks/serve.py --quick    # smoke run (16 requests)

A real server (uvicorn on 127.0.0.1, a free port, in this process's thread) over the demo SDAR Countdown model;
the requests are the demo's held-out prompts with rollout-like decoding (temperature 1, threshold 0.9, each request
its own seed, so answers end after different numbers of steps). ``sequential``: one client, one request after the
other. ``cN``: N client threads share the list. Reported per mode: answer tokens/s and requests/s (wall clock),
p50/p99 request latency, and each as a ratio to sequential; the run checks that every mode's answers equal
sequential's (a request's answer does not depend on who shares its steps). ``--json PATH`` writes the numbers.
``--adapters K`` also serves K LoRA adapters (rank 8, random, written to a temporary folder) and sends the requests
round-robin to the base model and each adapter (their ``model`` field): the mixed-adapter batch at work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dllm_rl

DEMO = Path(dllm_rl.__file__).parent / "assets" / "demo"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))


def _bodies(n: int, gen: int) -> list[dict]:
    rows = [json.loads(line) for line in (DEMO / "countdown_heldout.jsonl").read_text().splitlines()]
    return [{"prompt": f"nums {' '.join(map(str, r['nums']))} target {r['target']}\n", "max_tokens": gen,
             "temperature": 1.0, "threshold": 0.9, "seed": i} for i, r in enumerate(rows[:n])]


def _write_adapters(root: Path, k: int) -> dict[str, str]:
    """``k`` LoRA adapters of the demo model with random B matrices (a fresh adapter changes nothing)."""
    import torch

    from dllm_rl.models import load_model
    from dllm_rl.training.lora import LoraOptions, apply_lora, save_adapter

    out = {}
    for i in range(k):
        model = apply_lora(load_model(DEMO / "sdar-countdown"), LoraOptions(enabled=True, r=8), seed=i)
        g = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for name, p in model.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        save_adapter(model, root / f"lora{i}")
        out[f"lora{i}"] = str(root / f"lora{i}")
    return out


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def _run(client, bodies: list[dict], clients: int) -> dict:
    def one(body):
        t0 = time.perf_counter()
        r = client.post("/v1/completions", json=body)
        r.raise_for_status()
        out = r.json()
        return time.perf_counter() - t0, out["choices"][0]["text"], out["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    if clients == 0:
        results = [one(b) for b in bodies]
    else:
        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(one, bodies))
    wall = time.perf_counter() - t0
    lat = [r[0] for r in results]
    tokens = sum(r[2] for r in results)
    return {"wall_s": wall, "tok_s": tokens / wall, "req_s": len(bodies) / wall, "p50_s": _percentile(lat, 50),
            "p99_s": _percentile(lat, 99), "tokens": tokens, "texts": [r[1] for r in results]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 requests instead of 64")
    ap.add_argument("--requests", type=int, default=None, help="requests per mode (default 64; --quick 16)")
    ap.add_argument("--gen", type=int, default=32, help="max_tokens of every request (default 32)")
    ap.add_argument("--slots", type=int, default=32, help="the server's slots (default 32)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--adapters", type=int, default=0, help="also serve this many LoRA adapters, the requests "
                    "round-robin over them and the base model (default 0)")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import httpx
    import torch
    from serve_helpers import running

    from dllm_rl.sampling import DecodeConfig
    from dllm_rl.serve.cli import build_server
    from dllm_rl.serve.config import ServeConfig

    torch.set_num_threads(args.threads)
    n = args.requests or (16 if args.quick else 64)
    bodies = _bodies(n, args.gen)
    tmp = tempfile.TemporaryDirectory()
    loras = _write_adapters(Path(tmp.name), args.adapters) if args.adapters else None
    for i, body in enumerate(bodies):
        if loras and i % (len(loras) + 1):
            body["model"] = list(loras)[i % (len(loras) + 1) - 1]
    server = build_server(str(DEMO / "sdar-countdown"), DecodeConfig(gen_length=args.gen, threshold=0.9),
                          ServeConfig(slots=args.slots, max_queue=4 * n), device=args.device, loras=loras)
    modes = {"sequential": 0, "c1": 1, "c8": 8, "c32": 32}
    with running(server) as url, httpx.Client(base_url=url, timeout=600) as client:
        _run(client, bodies[:2], 0)  # warm-up
        results = {name: _run(client, bodies, c) for name, c in modes.items()}
    base = results["sequential"]
    same = {name: r["texts"] == base["texts"] for name, r in results.items()}
    print(f"serve benchmark: {n} requests, max_tokens {args.gen}, {args.slots} slots, demo sdar-countdown"
          f"{f' and {args.adapters} LoRA adapters' if args.adapters else ''}, {args.device}, {args.threads} thread(s)")
    print(f"{'mode':<11}{'tok/s':>9}{'req/s':>8}{'p50 s':>8}{'p99 s':>8}{'x tok/s':>9}{'x p50':>7}{'x p99':>7}  same")
    report = {}
    for name, r in results.items():
        ratios = {"tok_s": r["tok_s"] / base["tok_s"], "p50": r["p50_s"] / base["p50_s"],
                  "p99": r["p99_s"] / base["p99_s"]}
        print(f"{name:<11}{r['tok_s']:>9.1f}{r['req_s']:>8.2f}{r['p50_s']:>8.3f}{r['p99_s']:>8.3f}"
              f"{ratios['tok_s']:>9.2f}{ratios['p50']:>7.2f}{ratios['p99']:>7.2f}  {same[name]}")
        report[name] = {k: v for k, v in r.items() if k != "texts"} | {"ratio_to_sequential": ratios,
                                                                       "same_answers": same[name]}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
