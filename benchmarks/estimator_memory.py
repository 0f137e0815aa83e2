"""Peak memory of one policy update vs the number of Monte-Carlo draws: ESPO's ELBO vs BGPO.

    python benchmarks/estimator_memory.py [--quick]

One update = what the trainer does for one micro-batch: ESPO scores every draw under grad and back-propagates
its sequence loss once (every draw's graph is alive together); BGPO scores the old policy without grad, one
draw's rows per call, then back-propagates draw by draw (:mod:`dllm_rl.rl.draw_backward`). Each
(method, draws) configuration runs in its own subprocess; the number is the peak memory of the update above
the memory held just before it (CPU: max RSS from ``getrusage`` minus the RSS before; CUDA:
``torch.cuda.max_memory_allocated`` minus the allocation before), printed as a ratio to the 1-draw peak.

Both use ESPO's coupled ELBO draws (a draw's two rows score every counted token once), so every draw scores
the same number of tokens: with uncoupled draws a draw's memory follows its masked count ``n`` (the
scored tokens' float32 log-softmax), and the 8-draw run would hold a draw with ``n`` near ``L`` where the
1-draw run drew an average one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch

from dllm_rl.estimators import ScoringBatch, estimate
from dllm_rl.models import build_model, tiny_config
from dllm_rl.rl.draw_backward import backward_by_draw
from dllm_rl.rl.losses import LossConfig
from dllm_rl.rl.methods import POLICY_LOSSES

DRAWS = (1, 2, 4, 8)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure(method: str, num_mc: int, quick: bool, device: str) -> float:
    """Peak bytes of one update above the bytes held before it (this process only)."""
    torch.manual_seed(0)
    hidden, layers, vocab, b_n, p_n, g_n = (64, 2, 512, 4, 8, 32) if quick else (256, 4, 4096, 8, 32, 128)
    cfg = tiny_config("llada", vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2,
                      intermediate_size=hidden * 3)
    model = build_model("llada", cfg, seed=0)
    model.model.to(device)
    g = torch.Generator().manual_seed(0)
    batch = ScoringBatch(torch.randint(0, vocab - 3, (b_n, p_n), generator=g).to(device),
                         torch.ones(b_n, p_n, dtype=torch.bool, device=device),
                         torch.randint(0, vocab - 3, (b_n, g_n), generator=g).to(device),
                         torch.ones(b_n, g_n, dtype=torch.bool, device=device))
    adv = torch.linspace(-1, 1, b_n, device=device)
    opts = {"num_mc": num_mc, "coupled": True}  # each draw scores every token once (its n and L - n rows)
    config = LossConfig(aggregation="seq_mean")
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    if method == "espo":
        new = estimate(model, "elbo", batch, torch.Generator().manual_seed(1), **opts)
        old = type(new)(logp=new.logp.detach(), weight=new.weight, forwards=new.forwards)
        POLICY_LOSSES["sequence"](new, old, None, adv, batch.lengths, config).loss.backward()
    else:
        with torch.no_grad():
            old = estimate(model, "elbo", batch, torch.Generator().manual_seed(1), max_rows=2 * b_n, **opts)
        backward_by_draw(model, "elbo", batch, 1, opts, POLICY_LOSSES["bgpo"], old, None, adv, config, 1.0,
                         lambda loss, last: loss.backward(), current=old)  # on-policy, as the trainer
    if cuda:
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - before)
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a smaller model and batch (smoke run)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--one", nargs=2, metavar=("METHOD", "DRAWS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        torch.set_num_threads(2)
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.quick, args.device)))
        return
    rows = {}
    # CPU: a fixed mmap threshold makes glibc return every large freed block at once, so RSS follows the live
    # tensors (with its default, adaptive threshold freed blocks stay in the heap and RSS keeps old peaks)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    for method in ("espo", "bgpo"):
        for d in DRAWS:
            cmd = [sys.executable, __file__, "--one", method, str(d), "--device", args.device]
            out = subprocess.run(cmd + (["--quick"] if args.quick else []), capture_output=True, text=True, check=True,
                                 env=env)
            rows[method, d] = float(out.stdout.strip().splitlines()[-1])
    what = "CUDA max_memory_allocated" if args.device.startswith("cuda") else "CPU max RSS"
    print(f"peak memory of one update above the memory before it ({what}), ratio to 1 draw")
    print(f"{'method':<8}" + "".join(f"{f'{d} draws':>12}" for d in DRAWS) + f"{'1-draw MiB':>12}")
    for method in ("espo", "bgpo"):
        base = rows[method, 1]
        print(f"{method:<8}" + "".join(f"{rows[method, d] / base:>11.2f}x" for d in DRAWS) + f"{base / 2**20:>12.1f}")
    worst = rows["bgpo", 8] / rows["bgpo", 1]
    print(f"bgpo at 8 draws: {worst:.2f}x the 1-draw peak ({'<=' if worst <= 1.2 else '>'} 1.2x)")


if __name__ == "__main__":
    main()
