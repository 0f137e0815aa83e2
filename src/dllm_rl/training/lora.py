"""LoRA through ``peft`` (Hu et al. 2021, "LoRA", eq. 3: ``W x + (alpha / r) B A x``).

:func:`apply_lora` wraps the HF module in place, so the wrapped module stays at ``dlm.model`` and every
forward of the :class:`~dllm_rl.models.DiffusionLM` goes through the adapters. The frozen base weights
are the reference policy for free: ``with dlm.model.disable_adapter(): ...``.
:func:`merged_model` builds a plain (adapter-free) model with ``W + (alpha / r) B A`` for saving in the
published layout, without touching the live adapters.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import init_empty_weights

from dllm_rl.config import Checked, field
from dllm_rl.errors import UserError
from dllm_rl.models import DiffusionLM
from dllm_rl.models.lora_twins import tie_lora_twins

ADAPTER_NAME = "default"


@dataclass
class LoraOptions(Checked):
    """LoRA adapters (``peft``); the base weights stay frozen."""

    enabled: bool = field(False, help="train LoRA adapters instead of all weights")
    r: int = field(16, ge=1, help="LoRA rank r (Hu et al. 2021)")
    alpha: int = field(32, help="LoRA alpha; the update is scaled by alpha / r")
    dropout: float = field(0.0, ge=0, lt=1, help="dropout on the LoRA input")
    target_modules: list[str] | None = field(
        None, help="HF module names to adapt; null = the family's lora_target_modules (all attention + MLP "
        "projections). In a multimodal family a name is adapted in the language model only, unless the language "
        "model has no such module (e.g. fc1, linear_1: the vision tower's, the projector's)"
    )


def has_lora(dlm: DiffusionLM) -> bool:
    """True when ``dlm.model`` is a ``peft`` model."""
    return hasattr(dlm.model, "get_base_model") and hasattr(dlm.model, "peft_config")


def apply_lora(dlm: DiffusionLM, opts: LoraOptions, seed: int = 0) -> DiffusionLM:
    """Wrap ``dlm.model`` with fresh LoRA adapters (in place; returns ``dlm``). Only adapters are trainable.

    The adapters' random init (peft: Kaiming-uniform A, zero B) is drawn from a torch RNG seeded with
    ``seed`` inside ``fork_rng``, so it is reproducible and the caller's global RNG is untouched.
    """
    from peft import LoraConfig, get_peft_model

    if has_lora(dlm):
        raise UserError("apply_lora: the model already has LoRA adapters")
    targets = lora_targets(dlm, list(opts.target_modules or dlm.family.lora_target_modules))
    cfg = LoraConfig(r=opts.r, lora_alpha=opts.alpha, lora_dropout=opts.dropout, target_modules=targets, bias="none")
    devices = [dlm.device] if dlm.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        dlm.model = get_peft_model(dlm.model, cfg, adapter_name=ADAPTER_NAME)
    tie_lora_twins(dlm.model)
    return dlm


def lora_targets(dlm: DiffusionLM, targets: list[str]) -> list[str] | str:
    """``targets`` (module names, matched as peft does: the name or a dotted suffix of it) as peft's
    ``target_modules``, kept inside the family's language model (:attr:`Family.lora_scope`).

    Without a scope the list goes to peft unchanged. With one (LLaDA-V: ``model.language_model``), a target
    that the language model has is adapted there only, so the default q/k/v_proj leave SigLIP's attention
    frozen; a target only the vision tower or projector has (``fc1``, ``linear_1``) was asked for by name and
    is adapted where it is. The result is then peft's regex form (``re.fullmatch`` on module names), which
    ``adapter_config.json`` stores as one line.
    """
    names = [name for name, _ in dlm.model.named_modules()]
    scope = dlm.family.lora_scope
    scopes = [scope] if isinstance(scope, str) else list(scope)
    inside, anywhere, missing = [], [], []
    for target in targets:
        hits = [n for n in names if n == target or n.endswith(f".{target}")]
        if not hits:
            missing.append(target)
        elif any(s and n.startswith(f"{s}.") for n in hits for s in scopes):
            inside.append(target)
        else:
            anywhere.append(target)
    if missing:
        raise UserError(f"lora.target_modules {missing} are not modules of this {dlm.family.name} model")
    if not inside:
        return targets
    where = "|".join(map(re.escape, scopes))
    alternatives = [rf"(?:{where})\.(?:.*\.)?(?:{'|'.join(map(re.escape, inside))})"]
    if anywhere:
        alternatives.append(rf"(?:.*\.)?(?:{'|'.join(map(re.escape, anywhere))})")
    return "|".join(f"(?:{a})" for a in alternatives)


def merged_state_dict(dlm: DiffusionLM, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """HF-named weights with the active adapters merged (``W + (alpha/r) B A``, computed in float32)."""
    from peft.tuners.lora import LoraLayer

    if not has_lora(dlm):
        return {k: v.detach().to(device) for k, v in dlm.model.state_dict().items()}
    base = dlm.model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    lora_modules = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        merged[name.replace(".base_layer.", ".")] = tensor.detach().to(device)
    with torch.no_grad():
        for name, module in lora_modules.items():
            weight = module.get_base_layer().weight
            out = weight.detach().float()
            for adapter in module.active_adapters:
                if adapter in module.lora_A and adapter not in module.merged_adapters:
                    out = out + module.get_delta_weight(adapter).float()
            merged[f"{name}.weight"] = out.to(device=device, dtype=weight.dtype)
    return merged


def merged_model(dlm: DiffusionLM, device: str | torch.device = "cpu") -> DiffusionLM:
    """A plain :class:`DiffusionLM` (stock HF module, no adapters) holding the merged weights on ``device``.

    The live model is untouched (training can continue). Tensors not adapted by LoRA are shared with
    the live model when it already lives on ``device``. Use it to save the published layout or to
    evaluate without the ``peft`` forward overhead.
    """
    if not has_lora(dlm):
        return dlm
    state = merged_state_dict(dlm, device)
    hf_config = dlm.model.get_base_model().config
    with init_empty_weights(include_buffers=False):
        shell = dlm.family.hf_auto_class.from_config(hf_config, attn_implementation=hf_config._attn_implementation)
    if bool(hf_config.tie_word_embeddings):
        state.pop("lm_head.weight", None)
    shell.load_state_dict(state, strict=False, assign=True)
    if bool(hf_config.tie_word_embeddings):
        shell.tie_weights()
    missing = [n for n, p in shell.named_parameters() if p.device.type == "meta"]
    if missing:
        raise RuntimeError(f"merged_model: no merged value for {missing[:5]}")
    shell.to(device)
    shell.eval()
    return dlm.over(shell)


def save_adapter(dlm: DiffusionLM, directory: str | Path) -> Path:
    """Write the adapters with ``peft``'s ``save_pretrained`` (``adapter_config.json`` + safetensors)."""
    if not has_lora(dlm):
        raise UserError("save_adapter: the model has no LoRA adapters")
    directory = Path(directory)
    dlm.model.save_pretrained(str(directory))
    return directory


def load_adapter_weights(dlm: DiffusionLM, directory: str | Path) -> None:
    """Load adapter weights saved by :func:`save_adapter` into the live adapters of ``dlm`` (in place)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    if not has_lora(dlm):
        raise UserError("load_adapter_weights: the model has no LoRA adapters (apply_lora first)")
    file = Path(directory) / "adapter_model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no adapter weights")
    result = set_peft_model_state_dict(dlm.model, load_file(str(file)), adapter_name=ADAPTER_NAME)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise UserError(f"{file}: adapter tensors {unexpected[:5]} do not match this model's adapters")


def load_named_adapters(dlm: DiffusionLM, adapters: Mapping[str, str | Path]) -> DiffusionLM:
    """Load saved LoRA adapters (``peft``'s ``adapter_config.json`` + weights, e.g. a run's
    ``checkpoints/step-N/adapter``) into ``dlm`` under their names, for inference (in place; returns ``dlm``);
    :func:`active_adapter` chooses the one a forward uses, a forward's ``adapter_names`` one per row (the engine
    does both)."""
    from peft import PeftModel

    if has_lora(dlm):
        raise UserError("load_named_adapters: the model has LoRA adapters already")
    for i, (name, path) in enumerate(adapters.items()):
        folder = Path(path).expanduser()
        if not (folder / "adapter_config.json").is_file():
            raise UserError(f"LoRA adapter {name!r}: {folder} holds no adapter_config.json (a LoRA adapter folder, "
                            "such as a run's checkpoints/step-N/adapter)")
        try:
            if i == 0:
                dlm.model = PeftModel.from_pretrained(dlm.model, str(folder), adapter_name=name, is_trainable=False)
            else:
                dlm.model.load_adapter(str(folder), adapter_name=name, is_trainable=False)
        except (ValueError, RuntimeError, KeyError) as err:
            raise UserError(f"LoRA adapter {name!r} ({folder}) does not fit this model: {err}") from None
    tie_lora_twins(dlm.model)
    dlm.model.eval()
    return dlm


def mixed_batch_refusal(dlm: DiffusionLM, name: str) -> str | None:
    """Why adapter ``name`` cannot share a forward with other adapters (``peft``'s mixed-adapter batch, which the
    engine runs: plain LoRA only), or None."""
    cfg = dlm.model.peft_config[name]
    kind = str(getattr(cfg.peft_type, "value", cfg.peft_type))
    if kind != "LORA":
        return f"LoRA adapter {name!r} is a {kind} adapter; the engine batches LoRA adapters only"
    if getattr(cfg, "use_dora", False):
        return (f"LoRA adapter {name!r} uses DoRA, which peft cannot batch beside other adapters; merge it into the "
                "model and serve the merged checkpoint")
    return None


@contextlib.contextmanager
def active_adapter(dlm: DiffusionLM, name: str | None) -> Iterator[None]:
    """Forwards inside the block use LoRA adapter ``name`` (None: the base model, adapters disabled); the adapter
    active before is active again after (which adapters are trainable unchanged)."""
    if not has_lora(dlm):
        if name is not None:
            raise UserError(f"active_adapter: the model has no LoRA adapter {name!r}")
        yield
    elif name is None:
        with dlm.model.disable_adapter():
            yield
    else:
        before = dlm.model.active_adapter
        trainable = {n for n, p in dlm.model.named_parameters() if p.requires_grad}
        dlm.model.set_adapter(name, inference_mode=True)
        try:
            yield
        finally:
            dlm.model.set_adapter(before, inference_mode=True)
            for n, p in dlm.model.named_parameters():
                if n in trainable:
                    p.requires_grad_(True)
