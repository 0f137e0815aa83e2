"""Build DeepSpeed's CPU ops once, at install time, for the ZeRO tests on CPU ranks.

A ZeRO run on CPU ranks JIT-compiles DeepSpeed's shared-memory all-reduce (``deepspeed_shm_comm``, every ZeRO
stage) and, with optimizer offload, its CPU Adam (``cpu_adam``) at its first launch: about a minute each on
2 cores, with both ranks waiting on one build. Built here (into torch's extension cache, where the ranks load
them from), the suite spends its time on tests. Needs a C++ compiler (``make cxx``). A no-op without the
deepspeed package.
"""

import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the CPU ops, also on a machine with a GPU

try:
    from deepspeed.accelerator import get_accelerator
except ImportError:
    print("build_deepspeed_ops: deepspeed is not installed; nothing to build")
    sys.exit(0)

for name in ("ShareMemCommBuilder", "CPUAdamBuilder"):
    start = time.monotonic()
    get_accelerator().create_op_builder(name).load(verbose=False)
    print(f"build_deepspeed_ops: {name} ready ({time.monotonic() - start:.0f} s)")
