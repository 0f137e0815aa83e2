"""How many intra-op threads torch uses on CPU: chosen from what the machine offers when the work starts.

torch starts one intra-op thread per core. When another program holds a core, each parallel op waits for the thread
whose core was taken: on a 2-core machine, the block demo's RL step took 3.6 s with two threads and both cores free,
10.3 s with two threads beside a program spinning on one core, and 5.6 s with the count chosen here (one) beside it
(``benchmarks/sampling.py --only threads``; the issue that asked for this measured 36x on a busier machine). With
both cores free two threads were 1.5x faster than one (an earlier run), so the count follows the cores that are
free, not the model's size:

* the cores this process may run on (its affinity) that were mostly idle over a short sample of ``/proc/stat``
  (:data:`SAMPLE_S`; a core is free when it spent at least half of it idle; time stolen by a hypervisor counts as
  busy), at least one; without ``/proc/stat``, the cores less the 1-minute load average;
* under a launcher that started several processes on this machine (``LOCAL_WORLD_SIZE`` > 1) its usable cores
  shared among them, unsampled (the ranks start together and would see one another's loading as busy); torchrun and
  ``accelerate launch`` set ``OMP_NUM_THREADS=1`` for several processes unless it is set, which then wins;
* ``OMP_NUM_THREADS`` set in the environment, or a command's own setting (``train.num_threads``, ``--threads``),
  wins.

The count is chosen once, when a command has loaded its model: a program that starts afterwards on the same cores
is not seen (set the count then).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

#: seconds of /proc/stat sampled to see which cores are free
SAMPLE_S = 0.1


def _cpu_ticks() -> dict[int, tuple[int, int]] | None:
    """Per CPU id: (all ticks, idle + iowait ticks) from ``/proc/stat`` (None where it cannot be read)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *fields = line.split()
            ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            out[int(name[3:])] = (sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0))
    return out or None


def usable_cores() -> list[int]:
    """The CPU ids this process may run on (its affinity)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def free_cores(sample_s: float = SAMPLE_S) -> int:
    """The cores this process may run on that were at least half idle over ``sample_s`` seconds, at least 1."""
    cores = usable_cores()
    first = _cpu_ticks()
    if first is None:
        busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        return max(1, len(cores) - int(busy + 0.5))
    time.sleep(sample_s)
    second = _cpu_ticks() or {}
    free = 0
    for core in cores:
        if core not in first or core not in second:
            free += 1  # not listed: nothing says it is busy
            continue
        total, idle = (b - a for a, b in zip(first[core], second[core]))
        free += total <= 0 or 2 * idle >= total
    return max(1, free)


def cpu_threads(requested: int | None = None) -> int:
    """The intra-op thread count: ``requested``, else ``OMP_NUM_THREADS`` when set, else the usable cores shared among
    the processes a launcher started on this machine (``LOCAL_WORLD_SIZE`` > 1), else :func:`free_cores`."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be >= 1, got {requested}")
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    local = os.environ.get("LOCAL_WORLD_SIZE", "1").strip()
    if local.isdigit() and int(local) > 1:
        return max(1, len(usable_cores()) // int(local))
    return free_cores()


def use_cpu_threads(device: torch.device | str, requested: int | None = None) -> int:
    """Set torch's intra-op threads (:func:`cpu_threads`) when ``device`` is the CPU, and return the count; on
    another device torch's setting is left alone (and returned)."""
    if torch.device(device).type != "cpu":
        return torch.get_num_threads()
    n = cpu_threads(requested)
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n
