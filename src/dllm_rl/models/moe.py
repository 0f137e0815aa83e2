"""Mixture-of-experts helpers: router statistics, frozen routers, active parameters.

The routers are HF's (``Qwen3MoeTopKRouter``: softmax scores; ``Glm4MoeTopkRouter``: sigmoid scores with
an expert bias for the choice; ``DiffusionGemmaTextRouter``: softmax probabilities, which it returns as they are).
Each returns ``(router_logits or probabilities, weights, expert_indices)`` for the flattened tokens; forward
hooks read them. DiffusionGemma's encoder and decoder layers are twins over the same (tied) weights, so its
routers come in pairs sharing one gate; freezing either freezes both, and its statistics are read on the stack
that reads clean text (:attr:`Family.router_stack`: the encoder).
HF's experts have **no capacity limit** (every token goes to its top-k experts, nothing is dropped), so
padding tokens can take no real token's place; they are still left out of the statistics here, and the padding
tests show they change no real token's output.

The auxiliary load-balancing loss is **off**: our forwards never ask HF for it (no ``labels``, no
``output_router_logits``), as is usual for RL post-training of MoE models, whose routers are often frozen
too (``freeze_router``).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn

from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.models.masks import position_ids_from_valid

# Router classes by the end of their (lower-cased) name, and what their first output holds.
_ROUTER_SCORES = {"topkrouter": "logits", "textrouter": "probabilities"}


def _router_kind(module: nn.Module) -> str | None:
    name = type(module).__name__.lower()
    return next((kind for end, kind in _ROUTER_SCORES.items() if name.endswith(end)), None)


def routers(model: nn.Module) -> list[nn.Module]:
    """The router (gate) modules of an HF MoE model, in layer order (DiffusionGemma: the encoder's, then the
    decoder's)."""
    return [m for m in model.modules() if _router_kind(m) is not None]


def freeze_routers(model: nn.Module) -> int:
    """Stop gradients into every router's weight (the usual practice in MoE RL); returns how many."""
    found = routers(model)
    for gate in found:
        gate.requires_grad_(False)
    return len(found)


@contextmanager
def _recording(model: nn.Module):
    outputs: list[tuple[torch.Tensor, torch.Tensor, str]] = []

    def hook(module, _inputs, out):
        kind = "sigmoid" if hasattr(module, "e_score_correction_bias") else _router_kind(module)
        outputs.append((out[0].detach().float(), out[2].detach(), kind))

    handles = [gate.register_forward_hook(hook) for gate in routers(model)]
    try:
        yield outputs
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def router_stats(dlm: DiffusionLM, input_ids: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """Router statistics over the real (``valid``) tokens of one forward of ``input_ids``:

    * ``moe_load_max`` / ``moe_load_min``: the largest / smallest expert load, as a multiple of the uniform
      load (the fraction of (token, slot) choices an expert receives times the number of experts; 1 =
      balanced), averaged over the MoE layers;
    * ``moe_router_entropy``: mean entropy (nats) of each token's routing distribution (softmax of the
      router logits, or the normalised sigmoid scores of LLaDA2.x), over tokens and layers; its maximum is
      ``log(num_experts)``, reported as ``moe_router_entropy_max``.

    Empty for a dense model, and for a model of an MoE family whose layers are all dense (LLaDA2's first
    ``first_k_dense_replace`` layers are, so a 1-layer one has no router). A family with a
    :attr:`~dllm_rl.models.families.base.Family.router_stack` (DiffusionGemma) runs that stack alone over
    ``input_ids``: its causal encoder, whose routers share their weights with the decoder's."""
    if not dlm.family.moe:
        return {}
    was_training = dlm.model.training
    dlm.model.eval()
    stack = dlm.family.router_stack
    try:
        if stack:
            module = dlm.causal_lm.get_submodule(stack)
            with _recording(module) as outputs:
                module(input_ids=input_ids, attention_mask=valid.long(), position_ids=position_ids_from_valid(valid),
                       use_cache=False)
        else:
            with _recording(dlm.hf_model) as outputs:
                dlm(input_ids, attention_mask=valid)
    finally:
        dlm.model.train(was_training)
    if not outputs:
        return {}
    flat_valid = valid.reshape(-1).bool()
    loads, entropies = [], []
    for scores, idx, kind in outputs:
        scores, idx = scores[flat_valid], idx[flat_valid]
        n_exp = scores.shape[-1]
        counts = torch.bincount(idx.reshape(-1), minlength=n_exp).float()
        loads.append(counts / counts.sum().clamp(min=1) * n_exp)
        probs = {"sigmoid": torch.sigmoid, "logits": lambda x: torch.softmax(x, -1)}.get(kind, lambda x: x)(scores)
        probs = probs / probs.sum(-1, keepdim=True)
        entropies.append(-(probs * probs.clamp(min=1e-30).log()).sum(-1).mean())
    load = torch.stack(loads).mean(0)
    return {"moe_load_max": float(load.max()), "moe_load_min": float(load.min()),
            "moe_router_entropy": float(torch.stack(entropies).mean()),
            "moe_router_entropy_max": math.log(load.numel())}


def moe_summary(dlm: DiffusionLM) -> dict[str, int] | None:
    """Experts per MoE layer, experts chosen per token, and the parameters one token uses (embeddings,
    attention, dense/shared MLPs and its top-k of the routed experts; tied tensors, such as DiffusionGemma's
    encoder and decoder twins, counted once); None for a dense model."""
    if not dlm.family.moe:
        return None
    cfg = dlm.config
    n_exp = int(getattr(cfg, "num_experts", None) or cfg.n_routed_experts)
    top_k = int(getattr(cfg, "num_experts_per_tok", None) or cfg.top_k_experts)
    total = dlm.num_parameters()
    routed = {id(p): p.numel() for name, p in dlm.hf_model.named_parameters(remove_duplicate=False)
              if ".experts." in name and name.endswith(("gate_up_proj", "down_proj"))}
    routed_total = sum(routed.values())
    return {"experts": n_exp, "experts_per_token": top_k,
            "active_parameters": total - routed_total + routed_total * top_k // n_exp}
