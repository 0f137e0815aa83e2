"""A copy of the policy used only to decode rollouts: in a lower precision (``rollout.dtype``) and/or
compiled (``rollout.compile``).

Rollouts are most of an RL step when decoding re-reads the whole window at every step (full attention
without a KV cache). With ``rollout.dtype: bfloat16`` the rollouts are decoded by a bfloat16 copy of the
policy, refreshed from the live weights before each step's rollouts, while the policy keeps its own dtype
for everything the loss uses: the old log-probs, the reference and the updates. So the first pass's ratio
is still exactly 1 and the gradients are as before; only the distribution the rollouts are sampled from is
the rounded policy's (the same split as trainers whose rollouts come from a bfloat16 inference engine).
The held-out evaluation decodes with the policy itself.

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
import shutil

import torch

from dllm_rl.config import ConfigError
from dllm_rl.models import DiffusionLM


def cxx_compiler() -> str | None:
    """The C++ compiler torch.compile would build CPU kernels with ($CXX, g++ or clang++), or None."""
    for name in (os.environ.get("CXX", "g++"), "g++", "clang++"):
        if path := shutil.which(name):
            return path
    return None


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
