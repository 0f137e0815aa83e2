"""Expert tensors: published checkpoints store one MLP per expert, transformers 5 one 3D tensor per layer.

Published: ``<layer>.mlp.experts.<j>.{gate,up,down}_proj.weight`` (``[I, H]``, ``[I, H]``, ``[H, I]``).
HF (``Qwen3MoeExperts`` / ``Glm4MoeExperts``): ``<layer>.mlp.experts.gate_up_proj`` ``[E, 2I, H]`` (gate
rows first, the forward splits them with ``chunk(2)``) and ``<layer>.mlp.experts.down_proj`` ``[E, H, I]``.

transformers does this merge inside ``from_pretrained`` (its ``qwen2_moe`` conversion mapping), whose
operations are internal to its loader and which we do not use (we read safetensors ourselves, shard by
shard, with our own errors); the merge is a stack and a concatenation, written here both ways.
"""

from __future__ import annotations

import re

import torch

from dllm_rl.errors import UserError

_PUB = re.compile(r"(?P<layer>.+\.mlp\.experts)\.(?P<j>\d+)\.(?P<proj>gate|up|down)_proj\.weight")
_HF = re.compile(r"(?P<layer>.+\.mlp\.experts)\.(?P<kind>gate_up_proj|down_proj)")


def fuse_experts(tensors: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
    """Published per-expert tensors -> HF fused tensors; other tensors pass through unchanged."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
    for name, t in tensors.items():
        m = _PUB.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        groups.setdefault(m["layer"], {})[(m["proj"], int(m["j"]))] = t
    for layer, parts in groups.items():
        missing = [f"{layer}.{j}.{p}_proj.weight" for j in range(num_experts) for p in ("gate", "up", "down")
                   if (p, j) not in parts]
        extra = sorted({j for _, j in parts if j >= num_experts})
        if missing or extra:
            detail = f"missing {missing[:3]}" if missing else f"expert ids {extra} >= num_experts {num_experts}"
            raise UserError(f"checkpoint experts of {layer} do not match the config's {num_experts} experts: {detail}")
        out[f"{layer}.gate_up_proj"] = torch.stack(
            [torch.cat([parts[("gate", j)], parts[("up", j)]], dim=0) for j in range(num_experts)])
        out[f"{layer}.down_proj"] = torch.stack([parts[("down", j)] for j in range(num_experts)])
    return out


def split_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF fused expert tensors -> published per-expert tensors (inverse of :func:`fuse_experts`)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        m = _HF.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        for j in range(t.shape[0]):
            if m["kind"] == "down_proj":
                out[f"{m['layer']}.{j}.down_proj.weight"] = t[j]
            else:
                gate, up = t[j].chunk(2, dim=0)
                out[f"{m['layer']}.{j}.gate_proj.weight"] = gate
                out[f"{m['layer']}.{j}.up_proj.weight"] = up
    return out
