"""A copy of the policy used only to decode rollouts: in a lower precision (``rollout.dtype``) and/or
compiled (``rollout.compile``).

Rollouts are most of an RL step when decoding re-reads the whole window at every step (full attention
without a KV cache). With ``rollout.dtype: bfloat16`` the rollouts are decoded by a bfloat16 copy of the
policy, refreshed from the live weights before each step's rollouts, while the policy keeps its own dtype
for everything the loss uses: the old log-probs, the reference and the updates. So the first pass's ratio
is still exactly 1 and the gradients are as before; only the distribution the rollouts are sampled from is
the rounded policy's (the same split as trainers whose rollouts come from a bfloat16 inference engine).
The held-out evaluation decodes with the policy itself.

Whether bfloat16 pays depends on the hardware: a CPU with AMX or AVX512-BF16 multiplies bfloat16 matrices
natively (the full demo model's rollouts ~2x faster than float32), while an AVX2-only CPU converts them in
software (~5x *slower*; `python benchmarks/rollout_copy.py` measures both). ``rollout.dtype: auto`` (the
full demo config's setting) therefore takes bfloat16 only where :func:`native_bfloat16` finds support.

Only the parameters are cast. Buffers (the rotary inverse frequencies) keep the policy's dtype, so token
positions are encoded exactly as the policy encodes them.

With ``compile`` the copy's transformer runs under ``torch.compile(dynamic=True)``: on a tiny model half of
a decoding forward is elementwise work (norms, rotary, activations, casts) that the compiler fuses. Shapes
are symbolic, so the one compile (on the first rollout) serves every batch size and prompt width. The
weights stay inputs of the compiled graph (inductor does not freeze them by default), so the in-place
refresh below reaches it.
"""

from __future__ import annotations

import copy
import os
import platform
import shutil

import torch

from dllm_rl.config import ConfigError
from dllm_rl.models import DiffusionLM
from dllm_rl.models.loading import resolve_dtype


def cxx_compiler() -> str | None:
    """The C++ compiler torch.compile would build CPU kernels with ($CXX, g++ or clang++), or None."""
    for name in (os.environ.get("CXX", "g++"), "g++", "clang++"):
        if path := shutil.which(name):
            return path
    return None


def native_bfloat16(device: torch.device | str) -> str | None:
    """What gives ``device`` native bfloat16 matrix products (e.g. ``"AMX"``), or None where bfloat16 would be
    emulated. x86 CPUs: torch's own instruction checks (those inductor uses); other CPUs: oneDNN's bfloat16
    check; CUDA: compute capability 8.0 or newer. A torch without these checks counts as no support, which
    leaves rollouts in the policy's dtype: never slower than without a copy."""
    device = torch.device(device)
    if device.type == "cuda":
        return "CUDA bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else None
    if device.type != "cpu":
        return None
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        for name, check in (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported")):
            if getattr(torch.cpu, check, lambda: False)():
                return name
        return None
    mkldnn_bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return f"{platform.machine()} BF16" if mkldnn_bf16 is not None and mkldnn_bf16() else None


def rollout_dtype(requested: str | None, policy_dtype: torch.dtype, device: torch.device | str
                  ) -> tuple[torch.dtype, str | None]:
    """The dtype rollouts decode in for ``rollout.dtype = requested``, and a line for the log (None when there
    is nothing to say). ``None`` keeps the policy's dtype; ``auto`` takes bfloat16 for a float32 policy where
    :func:`native_bfloat16` finds support and the policy's dtype elsewhere; a named dtype is taken as asked,
    with a warning when it is bfloat16 on a CPU that would emulate it."""
    if requested is None:
        return policy_dtype, None
    native = native_bfloat16(device)
    if requested == "auto":
        if policy_dtype != torch.float32:  # already a low precision: nothing to gain from a copy
            return policy_dtype, None
        if native:
            return torch.bfloat16, f"rollout.dtype=auto: rollouts decoded by a bfloat16 copy ({native})"
        return policy_dtype, "rollout.dtype=auto: rollouts decoded in float32 (no native bfloat16 on this device)"
    dtype = resolve_dtype(requested)
    if dtype == torch.bfloat16 and native is None and torch.device(device).type == "cpu":
        return dtype, ("warning: rollout.dtype=bfloat16 on a CPU without AMX or AVX512-BF16 emulates bfloat16 and "
                       "decodes several times slower than float32; set rollout.dtype=auto or float32")
    return dtype, None


class RolloutCopy:
    """A frozen, eval-mode copy of ``policy`` whose parameters are stored in ``dtype`` (compiled with
    ``compile``)."""

    def __init__(self, policy: DiffusionLM, dtype: torch.dtype, compile: bool = False):
        if compile and policy.device.type == "cpu" and cxx_compiler() is None:
            raise ConfigError("rollout.compile: torch.compile on CPU builds C++ kernels and no C++ compiler was "
                              "found (g++, clang++ or $CXX); install one (`make cxx`) or set rollout.compile=false")
        self.model = copy.deepcopy(policy).eval()
        trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
        self.source = [p for n, p in policy.named_parameters() if n in trainable]
        self.params = [p for n, p in self.model.named_parameters() if n in trainable]
        with torch.no_grad():
            for p in self.model.parameters():
                p.data = p.data.to(dtype)
        self.model.requires_grad_(False)
        if compile:
            self.model.hf_model.compile(dynamic=True)  # in place: names and parameters stay as they are

    @torch.no_grad()
    def refresh(self) -> DiffusionLM:
        """Copy (and cast) the policy's current trainable weights into the copy (frozen ones, e.g. a LoRA
        base, were cast once); returns the copy."""
        torch._foreach_copy_(self.params, [p.detach() for p in self.source])
        return self.model
