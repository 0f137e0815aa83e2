"""How many intra-op threads torch uses on CPU: chosen from what the work needs and what the machine offers.

torch starts one intra-op thread per core. On a tiny model every op takes microseconds, so a second thread adds
hand-offs and little work; and when another program holds a core, each parallel op waits for the thread whose core
was taken. Measured with the block demo model on a 2-core machine where another program sometimes held one core:
a step went from 0.84 s of rollout and 2.9 s of update (both cores free) to 30.5 s and 10.0 s with two threads
(``benchmarks/sampling.py --only threads`` measures it side by side). So:

* a model under :data:`SMALL_MODEL_PARAMS` parameters runs one thread;
* a larger one runs as many as there are free cores: the cores this process may use (its affinity) less those the
  1-minute load average says are busy, at least one;
* ``OMP_NUM_THREADS`` set in the environment, or a command's own setting (``train.num_threads``, ``--threads``),
  wins over both.
"""

from __future__ import annotations

import os

import torch

#: below this many parameters a model runs one intra-op thread (the demo models have ~1M; an 8B has 8e9)
SMALL_MODEL_PARAMS = 20_000_000


def free_cores() -> int:
    """The cores this process may run on (its CPU affinity) less the busy ones (the 1-minute load average,
    rounded), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, cores - int(busy + 0.5))


def cpu_threads(num_params: int, requested: int | None = None) -> int:
    """The intra-op thread count for a model of ``num_params`` parameters: ``requested``, else ``OMP_NUM_THREADS``
    when set, else 1 below :data:`SMALL_MODEL_PARAMS`, else :func:`free_cores`."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be >= 1, got {requested}")
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return 1 if num_params < SMALL_MODEL_PARAMS else free_cores()


def use_cpu_threads(model: torch.nn.Module, device: torch.device | str, requested: int | None = None) -> int:
    """Set torch's intra-op threads for ``model`` (:func:`cpu_threads` of its parameter count) when ``device`` is
    the CPU, and return the count; on another device torch's setting is left alone (and returned)."""
    if torch.device(device).type != "cpu":
        return torch.get_num_threads()
    n = cpu_threads(sum(p.numel() for p in model.parameters()), requested)
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n
