"""Load and save diffusion LMs in their *published* checkpoint layouts.

Loading reads ``config.json`` (family from ``model_type`` / ``architectures`` / ``auto_map``) and
safetensors weights, single-file or sharded with ``model.safetensors.index.json``; saving writes the
published names and config back so the published reference code could load what we save.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from accelerate import init_empty_weights
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from dllm_rl.errors import UserError
from dllm_rl.hub import resolve_model_path
from dllm_rl.models.attention import GROUPED_SDPA
from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.models.families import Family, detect_family, get_family, resolve_mask_token_id

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def read_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a checkpoint directory or hub id, with a clear error when it is missing or broken."""
    path = resolve_model_path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file}: no config.json (is {path} a model directory?)")
    return _read_json(cfg_file)


def _read_json(file: Path) -> Any:
    """A checkpoint's JSON file, or one line naming it when it is broken."""
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{file}: not valid JSON ({exc})") from exc


def read_generation_config(path: Path) -> dict[str, Any] | None:
    """A checkpoint directory's ``generation_config.json`` (None: it has none). Read as JSON and kept whole: its EOS
    ids end rows (:func:`~dllm_rl.models.diffusion_lm.eos_token_ids`) and :func:`save_model` writes it back."""
    file = path / "generation_config.json"
    if not file.is_file():
        return None
    gen = _read_json(file)
    if not isinstance(gen, dict):
        raise UserError(f"{file}: not a JSON object")
    return gen


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted(set(weight_map.values()))
        for f in files:
            if not (path / f).is_file():
                raise FileNotFoundError(f"{index}: shard {f} is listed but missing from {path}")
        return [path / f for f in files]
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _read_weights(file: Path, device, dtype) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file under their published names; a file that does not parse (empty,
    truncated, not safetensors) is named in the error."""
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            return {name: f.get_tensor(name).to(device=device, dtype=dtype) for name in f.keys()}
    except SafetensorError as exc:
        size = file.stat().st_size
        raise UserError(f"{file}: not a readable safetensors file ({exc}; {size} bytes): the file is corrupt or "
                        "truncated (an interrupted download or copy?); fetch or save it again") from None


def _published_names(fam: Family, state: dict[str, torch.Tensor], hf_config) -> list[str]:
    """The published names of some HF tensors, for error messages (HF names where a fused tensor needs
    its siblings to be named)."""
    try:
        return sorted(fam.to_published_state(state, hf_config))
    except KeyError:
        return sorted(state)


def _hf_state(fam: Family, files: list[Path], hf_config, expected: dict[str, torch.Tensor], device,
              dtype) -> dict[str, torch.Tensor]:
    """All checkpoint tensors converted to HF names (the family fuses experts / qkv where HF does), each
    checked against the model's names and shapes; errors name the published tensor and its file."""
    published: dict[str, torch.Tensor] = {}
    source: dict[str, Path] = {}
    for file in files:
        for name, tensor in _read_weights(file, device, dtype).items():
            published[name] = tensor
            source[name] = file
    state = fam.to_hf_state(published, hf_config)
    for hf_name, tensor in state.items():
        pub_names = sorted(set(_published_names(fam, {hf_name: tensor}, hf_config)) & set(source)) or [hf_name]
        where = source.get(pub_names[0], files[0])
        if hf_name not in expected:
            raise UserError(f"{where}: unexpected tensor {pub_names[0]!r} for a {fam.name} model")
        want = tuple(expected[hf_name].shape)
        if tuple(tensor.shape) != want:
            raise UserError(f"{where}: tensor {pub_names[0]!r} has shape {tuple(tensor.shape)}, config.json implies "
                            f"{want}")
    return state


def _instantiate(fam: Family, pub: dict[str, Any], dtype: torch.dtype, attn: str, empty: bool):
    if attn not in ATTN_IMPLEMENTATIONS:
        raise UserError(f"unknown attn_implementation {attn!r}; choose one of {', '.join(ATTN_IMPLEMENTATIONS)}")
    hf_config = fam.hf_config(pub)
    attn = GROUPED_SDPA if attn == "sdpa" else attn  # SDPA without repeating grouped keys (models.attention)
    if empty:  # parameters on the meta device, buffers (RoPE) real: weights are assigned from disk
        with init_empty_weights(include_buffers=False):
            model = fam.hf_auto_class.from_config(hf_config, attn_implementation=attn, dtype=dtype)
    else:
        model = fam.hf_auto_class.from_config(hf_config, attn_implementation=attn, dtype=dtype)
    return model


def load_model(
    path: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
    tokenizer_dir: str | Path | None = None,
) -> DiffusionLM:
    """Load a published-layout checkpoint directory, or hub id ``org/name[@revision]``
    (:func:`~dllm_rl.hub.resolve_model_path`), as a :class:`DiffusionLM`.

    The mask id is ``config.json``'s ``mask_token_id``, else the mask token of the tokenizer in
    ``tokenizer_dir`` (default: the checkpoint directory), else the family's published id
    (:func:`~dllm_rl.models.families.resolve_mask_token_id`); a family of uniform-state noise has none."""
    path = resolve_model_path(path)
    tokenizer_dir = resolve_model_path(tokenizer_dir) if tokenizer_dir is not None else None
    pub = read_config(path)
    fam = detect_family(pub, str(path / "config.json"))
    mask_id = resolve_mask_token_id(pub, fam, path / "config.json", tokenizer_dir or path)
    if mask_id is not None:  # None: uniform-state noise, no mask token
        pub["mask_token_id"] = mask_id
    torch_dtype = resolve_dtype(dtype)
    model = _instantiate(fam, pub, torch_dtype, attn_implementation, empty=True)
    expected = {k: v for k, v in model.state_dict().items()}
    tied = fam.tied(pub)
    state = _hf_state(fam, _weight_files(path), model.config, expected, device, torch_dtype)
    if tied:
        state.setdefault("lm_head.weight", state.get("model.embed_tokens.weight"))
    missing = sorted(set(expected) - set(state))
    if missing:
        names = _published_names(fam, {m: expected[m] for m in missing}, model.config)
        raise UserError(f"{path}: checkpoint lacks tensors {names[:5]}")
    model.load_state_dict(state, strict=True, assign=True)
    if tied:
        model.tie_weights()
    model.to(device)
    model.eval()
    return DiffusionLM(model, fam, pub, read_generation_config(path))


def build_model(
    family: str | Family,
    published_config: dict[str, Any],
    seed: int = 0,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str = "sdpa",
) -> DiffusionLM:
    """A randomly initialised model of ``family`` from a published-layout config (see ``tiny_config``)."""
    fam = family if isinstance(family, Family) else get_family(family)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _instantiate(fam, published_config, resolve_dtype(dtype), attn_implementation, empty=False)
    model.eval()
    return DiffusionLM(model, fam, published_config)


def published_state_dict(dlm: DiffusionLM) -> dict[str, torch.Tensor]:
    """The model's weights under their published names (tied heads written once, as published)."""
    fam = dlm.family
    model = dlm.hf_model
    if hasattr(model, "merge_and_unload") or hasattr(model, "get_base_model"):
        raise UserError("save a PEFT model after merging its adapters (merge_and_unload)")
    tied = bool(model.config.tie_word_embeddings)
    state = {k: v.detach() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    return {k: v.contiguous().clone() for k, v in fam.to_published_state(state, model.config).items()}


def save_model(
    dlm: DiffusionLM,
    path: str | Path,
    tokenizer=None,
    max_shard_size: int | str = "5GB",
    dtype: str | torch.dtype | None = None,
) -> Path:
    """Write ``dlm`` to ``path`` in its published layout (config.json + safetensors, sharded if large)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = published_state_dict(dlm)
    if dtype is not None:
        state = {k: v.to(resolve_dtype(dtype)) for k, v in state.items()}
    split = split_torch_state_dict_into_shards(state, max_shard_size=max_shard_size)
    for old in list(path.glob("model*.safetensors")) + list(path.glob("model.safetensors.index.json")):
        old.unlink()
    for filename, names in split.filename_to_tensors.items():
        save_file({n: state[n] for n in names}, str(path / filename), metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                 "weight_map": split.tensor_to_filename}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    pub = dlm.family.published_config(dlm.hf_model.config, dlm.published_config)  # the whole config (multimodal too)
    saved_dtype = next(iter(state.values())).dtype if state else dlm.dtype
    # transformers 5 writes ``dtype`` where 4.x wrote ``torch_dtype``: keep the key the published config uses
    dtype_key = "dtype" if "dtype" in pub and "torch_dtype" not in pub else "torch_dtype"
    pub[dtype_key] = str(saved_dtype).removeprefix("torch.")
    if dlm.mask_token_id is not None:
        pub["mask_token_id"] = dlm.mask_token_id
    key = dlm.family.block_size_key
    if dlm.block_size is not None and key and (key in pub or dlm.block_size != dlm.family.block_size):
        pub[key] = dlm.block_size
    (path / "config.json").write_text(json.dumps(pub, indent=2, sort_keys=True) + "\n")
    if dlm.generation_config is not None:
        (path / "generation_config.json").write_text(json.dumps(dlm.generation_config, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path
