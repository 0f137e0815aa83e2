"""Memory per GPU of one SFT / RL recipe on a published model, per sharding backend (an estimate, not a run).

    python benchmarks/memory_plan.py configs/models/llada-8b-instruct.json --gpus 8 --backend fsdp2 \\
        [--lora-r 16] [--prompt-len 256 --gen-len 256 --rollouts-per-gpu 16 --micro-batch 4] [--dtype bf16] \\
        [--gradient-checkpointing] [--two-stream] [--reference] [--gpu-mem 80]

MODEL_CONFIG is a published-layout ``config.json`` (or a checkpoint directory holding one); dense families
are read through :mod:`dllm_rl.models` (family detection, then the stock transformers config), MoE configs
(``num_experts``) from their published keys. Every row is counted in bytes:

- parameters: all weights in ``--dtype``; gradients: the trainable ones in ``--dtype``; AdamW: fp32 ``m`` and
  ``v`` (8 B per trainable parameter) plus the fp32 master copy (4 B) when ``--dtype`` is bf16 -- the
  16 B/parameter of mixed-precision Adam (Rajbhandari et al. 2020, ZeRO, arXiv 1910.02054, Sec. 3.1:
  ``2 + 2 + K`` with ``K = 12``). FSDP2 with accelerate's bf16 mixed precision keeps fp32 sharded
  parameters and gradients instead of a separate master: the same 16 B in total.
- sharding over ``--gpus`` N ranks (ZeRO Sec. 5, eq. for P_os+g and P_os+g+p): ``ddp`` none; ``zero2``
  gradients and optimizer / N; ``fsdp2`` and ``zero3`` everything / N, plus the working set of two gathered
  decoder layers (the running one and the prefetched one); ``zero3-offload`` keeps parameters, gradients and
  optimizer in CPU memory (shown per rank in the CPU column) and only the working set on the GPU.
- activations, per micro-batch of ``T = micro_batch x (prompt_len + gen_len)`` tokens (``+ gen_len`` more
  with ``--two-stream``, block TraceRL / SFT's noisy copy), stored in ``--dtype`` for the backward. Per
  token and decoder layer, the saved tensors are counted element by element:
  ``a = 4 H + 2 nh hd + 2 nkv hd + 4 F_act`` (two norm inputs and outputs; q and attention output; k, v;
  gate, up, SiLU(gate) and their product), with ``F_act = F`` (dense) or ``top_k x F_expert + F_shared +
  num_experts`` (MoE: the routed experts' MLPs each token runs, the shared expert and the router logits).
  Without gradient checkpointing: ``layers x T x a`` elements; with it: each layer's input ``layers x T x H``
  plus one layer recomputed in the backward, ``T x a`` (Korthikanti et al. 2022, arXiv 2205.05198, Sec. 4.1:
  ``s b h x const`` per layer with flash/sdpa attention, which stores no ``s^2`` scores).
- LM-head logits: ``T x vocab x 4`` bytes (fp32 logits for the log-probs); the chunked log-prob path never
  holds them, so the table prints the total with and without this term.
- rollout KV cache: ``rollouts_per_gpu x (prompt_len + gen_len) x layers x 2 x nkv x hd`` in ``--dtype``.
- ``--reference``: a frozen reference policy, sharded like the parameters (with LoRA the reference is the
  base under the disabled adapter and costs nothing).

LoRA (``--lora-r R``) trains ``R x (in + out)`` parameters per adapted projection: q, k, v, o and the dense
MLP's gate, up, down (MoE layers: attention only); the base weights are frozen (no gradients, no AdamW).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dllm_rl.models import detect_family

BACKENDS = ("ddp", "zero2", "zero3", "zero3-offload", "fsdp2")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
GIB = 1024**3


@dataclass(frozen=True)
class Shape:
    """The sizes of a decoder-only transformer that memory depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (the MLP of dense layers)
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    moe_layers: int = 0  # how many of the layers are MoE layers


def _dense_shape(pub: dict[str, Any], source: str) -> Shape:
    fam = detect_family(pub, source)
    hf = fam.hf_config(pub)
    return Shape(
        hidden=hf.hidden_size, layers=hf.num_hidden_layers, heads=hf.num_attention_heads,
        kv_heads=hf.num_key_value_heads,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        intermediate=hf.intermediate_size, vocab=hf.vocab_size, tied=bool(hf.tie_word_embeddings),
        qkv_bias=fam.name == "dream" or bool(getattr(hf, "attention_bias", False)), qk_norm=fam.name == "sdar",
    )


def _moe_shape(pub: dict[str, Any], source: str) -> Shape:
    need = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "num_experts",
            "num_experts_per_tok"]
    missing = [k for k in need if k not in pub]
    expert_f = pub.get("expert_intermediate_size", pub.get("moe_intermediate_size"))
    if missing or expert_f is None:
        missing += [] if expert_f is not None else ["expert_intermediate_size (or moe_intermediate_size)"]
        raise ValueError(f"{source}: MoE config is missing {', '.join(missing)}")
    layers = int(pub["num_hidden_layers"])
    freq = pub.get("moe_layer_freq")
    dense_first = int(pub.get("first_k_dense_replace", 0))
    moe_layers = sum(1 for x in freq if x) if isinstance(freq, list) else layers - dense_first
    heads = int(pub["num_attention_heads"])
    return Shape(
        hidden=int(pub["hidden_size"]), layers=layers, heads=heads,
        kv_heads=int(pub.get("num_key_value_heads") or heads),
        head_dim=int(pub.get("head_dim") or pub["hidden_size"] // heads),
        intermediate=int(pub.get("dense_intermediate_size") or pub.get("intermediate_size") or 0),
        vocab=int(pub["vocab_size"]), tied=bool(pub.get("tie_word_embeddings", False)),
        qkv_bias=bool(pub.get("attention_bias", False)), qk_norm=bool(pub.get("qk_layernorm", pub.get("use_qk_norm"))),
        experts=int(pub["num_experts"]), top_k=int(pub["num_experts_per_tok"]), expert_intermediate=int(expert_f),
        shared_intermediate=int(pub.get("shared_expert_intermediate_size") or 0), moe_layers=moe_layers,
    )


def read_shape(path: str | Path) -> Shape:
    """The :class:`Shape` of a published ``config.json`` (a file, or a directory holding one)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        pub = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file}: cannot read a config.json ({exc})") from exc
    return _moe_shape(pub, str(file)) if "num_experts" in pub else _dense_shape(pub, str(file))


def _attention_params(s: Shape) -> int:
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    bias = (q + 2 * kv) if s.qkv_bias else 0
    return s.hidden * q + 2 * s.hidden * kv + q * s.hidden + bias + (2 * s.head_dim if s.qk_norm else 0)


def _moe_mlp_params(s: Shape) -> int:
    experts = s.experts * 3 * s.hidden * s.expert_intermediate
    return experts + s.experts * s.hidden + 3 * s.hidden * s.shared_intermediate  # + router, shared expert


def layer_params(s: Shape, moe: bool) -> int:
    """Weights of one decoder layer: attention, two RMSNorms, and the SwiGLU MLP (or experts + router)."""
    mlp = _moe_mlp_params(s) if moe else 3 * s.hidden * s.intermediate
    return _attention_params(s) + 2 * s.hidden + mlp


def param_count(s: Shape) -> int:
    """All weights: embedding, LM head (unless tied), final norm and the layers."""
    dense_layers = s.layers - s.moe_layers
    return (s.vocab * s.hidden * (1 if s.tied else 2) + s.hidden + dense_layers * layer_params(s, False)
            + s.moe_layers * layer_params(s, True))


def lora_params(s: Shape, r: int) -> int:
    """Trainable LoRA weights: ``r x (in + out)`` per adapted projection (see the module docstring)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attn = r * ((s.hidden + q) + 2 * (s.hidden + kv) + (q + s.hidden))
    mlp = 3 * r * (s.hidden + s.intermediate)
    return s.layers * attn + (s.layers - s.moe_layers) * mlp


def activation_elements_per_token_layer(s: Shape) -> int:
    """``a = 4 H + 2 nh hd + 2 nkv hd + 4 F_act`` (module docstring)."""
    f_act = s.top_k * s.expert_intermediate + s.shared_intermediate + s.experts if s.moe_layers else s.intermediate
    return 4 * s.hidden + 2 * s.heads * s.head_dim + 2 * s.kv_heads * s.head_dim + 4 * f_act


@dataclass(frozen=True)
class Recipe:
    gpus: int = 8
    backend: str = "fsdp2"
    dtype: str = "bf16"
    lora_r: int = 0
    prompt_len: int = 256
    gen_len: int = 256
    rollouts_per_gpu: int = 16
    micro_batch: int = 4
    gradient_checkpointing: bool = False
    two_stream: bool = False
    reference: bool = False


def _shard(nbytes: int, n: int) -> int:
    return math.ceil(nbytes / n)


def plan(s: Shape, r: Recipe) -> dict[str, int]:
    """Bytes per GPU for each row of the table (``cpu_*`` rows: CPU memory per rank under offload)."""
    if r.backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {r.backend!r}")
    b, n = DTYPE_BYTES[r.dtype], r.gpus
    total = param_count(s)
    trainable = lora_params(s, r.lora_r) if r.lora_r else total
    states = {"parameters": (total + (trainable if r.lora_r else 0)) * b, "gradients": trainable * b,
              "optimizer m+v (fp32)": trainable * 8, "fp32 master": trainable * 4 if b == 2 else 0,
              "reference policy": total * b if r.reference and not r.lora_r else 0}
    shard = {"ddp": set(), "zero2": {"gradients", "optimizer m+v (fp32)", "fp32 master"}}.get(r.backend, set(states))
    rows = {k: _shard(v, n) if k in shard else v for k, v in states.items()}
    if r.backend == "zero3-offload":
        rows = {**{k: 0 for k in rows}, **{f"cpu {k}": v for k, v in rows.items()}}
    if r.backend in ("fsdp2", "zero3", "zero3-offload"):
        rows["gathered layers (2)"] = 2 * layer_params(s, s.moe_layers > 0) * b
    tokens = r.micro_batch * (r.prompt_len + r.gen_len + (r.gen_len if r.two_stream else 0))
    a = activation_elements_per_token_layer(s)
    act = (s.layers * s.hidden + a) if r.gradient_checkpointing else s.layers * a
    rows["activations"] = tokens * act * b
    rows["LM-head logits (fp32)"] = tokens * s.vocab * 4
    kv_per_token = s.layers * 2 * s.kv_heads * s.head_dim * b
    rows["rollout KV cache"] = r.rollouts_per_gpu * (r.prompt_len + r.gen_len) * kv_per_token
    return rows


def totals(rows: dict[str, int]) -> tuple[int, int]:
    """GPU bytes with the full LM-head logits, and with the chunked log-prob path (without them)."""
    gpu = sum(v for k, v in rows.items() if not k.startswith("cpu "))
    return gpu, gpu - rows["LM-head logits (fp32)"]


def format_table(s: Shape, r: Recipe, gpu_mem_gib: float) -> str:
    rows = plan(s, r)
    full, chunked = totals(rows)
    lines = [f"{param_count(s) / 1e9:.2f} B parameters ({s.layers} layers, {s.moe_layers} MoE), backend "
             f"{r.backend} on {r.gpus} GPUs, {r.dtype}, LoRA r={r.lora_r or '-'}, "
             f"gradient checkpointing {'on' if r.gradient_checkpointing else 'off'}",
             f"{'per GPU':<28}{'GiB':>10}{'bytes':>18}"]
    lines += [f"{k:<28}{v / GIB:>10.2f}{v:>18,}" for k, v in rows.items()]
    cap = int(gpu_mem_gib * GIB)
    for name, value in (("total, full logits", full), ("total, chunked log-probs", chunked)):
        verdict = "fits" if value <= cap else "does NOT fit"
        lines.append(f"{name:<28}{value / GIB:>10.2f}{value:>18,}  {verdict} in {gpu_mem_gib:g} GiB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_config", help="published config.json (or a checkpoint directory)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--backend", choices=BACKENDS, default="fsdp2")
    p.add_argument("--lora-r", type=int, default=0)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--gen-len", type=int, default=256)
    p.add_argument("--rollouts-per-gpu", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--two-stream", action="store_true", help="block models' [prompt | clean | noisy] layout")
    p.add_argument("--reference", action="store_true", help="a frozen reference policy copy (beta > 0, no LoRA)")
    p.add_argument("--gpu-mem", type=float, default=80.0, help="GiB per GPU")
    a = p.parse_args(argv)
    recipe = Recipe(gpus=a.gpus, backend=a.backend, dtype=a.dtype, lora_r=a.lora_r, prompt_len=a.prompt_len,
                    gen_len=a.gen_len, rollouts_per_gpu=a.rollouts_per_gpu, micro_batch=a.micro_batch,
                    gradient_checkpointing=a.gradient_checkpointing, two_stream=a.two_stream, reference=a.reference)
    try:
        print(format_table(read_shape(a.model_config), recipe, a.gpu_mem))
    except ValueError as exc:
        print(f"memory_plan: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
