"""The SFT run's configuration: ``dllm-rl sft CONFIG.yaml [key=value ...]`` reads an :class:`SFTConfig` (its
sections: the model, data, objective, optimiser, LoRA and the training loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from dllm_rl.config import Checked, ConfigError, field
from dllm_rl.config.loading import coerce
from dllm_rl.config.vocabulary import ModelSection, dtype_field, tokenizer_field
from dllm_rl.sft.data import DataConfig
from dllm_rl.sft.objectives import ObjectiveConfig
from dllm_rl.training import LoraOptions, OptimConfig
from dllm_rl.training.run_config import RunConfig


@dataclass
class ModelConfig(ModelSection):
    """The model to fine-tune: a published-layout checkpoint, or a fresh tiny model (``path: null``); where it
    trains is ``device`` (:class:`~dllm_rl.config.vocabulary.ModelSection`'s)."""

    path: str | None = field(None, help="checkpoint directory in a published layout (config.json + safetensors) "
                                        "or a hub id org/name[@revision]; "
                                        "null = build a fresh model of `family` from the sizes below")
    tokenizer: str | None = tokenizer_field(
        "null (the checkpoint's own tokenizer), char (the character tokenizer over `alphabet`: a fresh model's), or "
        "a tokenizer directory or hub id", renamed_values={"auto": None})
    alphabet: str | None = field(None, help="characters of the char tokenizer (null = the default alphabet)")
    words: list[str] = field(default_factory=list, help="char tokenizer: whole strings that get one token each "
                             "(e.g. [\"<answer>\", \"</answer>\"]: shorter completions, cheaper decoding)")
    family: Literal["llada", "dream", "sdar", "llada_v", "diffusion_gemma"] = field(
        "llada", help="family of a fresh model (path: null); diffusion_gemma: uniform-state, canvas of `block_size`")
    hidden_size: int = field(128, ge=1, help="fresh model: hidden size")
    num_layers: int = field(4, ge=1, help="fresh model: transformer layers")
    num_heads: int = field(4, ge=1, help="fresh model: attention heads")
    num_kv_heads: int = field(4, ge=1, help="fresh model: key/value heads (GQA when < num_heads)")
    intermediate_size: int = field(384, ge=1, help="fresh model: MLP width")
    block_size: int = field(4, ge=1, help="fresh block model (sdar): block size of block-causal attention; "
                                          "diffusion_gemma: canvas_length")
    num_experts: int | None = field(None, ge=1, help="fresh MoE model (diffusion_gemma): experts per layer (null: "
                                                     "the family's tiny default, 4)")
    experts_per_token: int | None = field(None, ge=1, help="fresh MoE model: experts each token is routed to (null: 2)")
    moe_intermediate_size: int | None = field(None, ge=1, help="fresh MoE model: each expert's MLP width (null: 16)")
    max_position_embeddings: int = field(256, ge=1, help="fresh model: context length")
    tie_word_embeddings: bool | None = field(
        None, help="fresh model: share input and output embeddings (null: the family's published default: untied, "
        "but tied for diffusion_gemma)")
    vision_image_size: int = field(384, ge=8, help="fresh llada_v: side in px of the SigLIP tower's input (LLaDA-V: "
                                   "384); each image is padded to a square and resized to it")
    vision_patch_size: int = field(14, ge=1, help="fresh llada_v: SigLIP patch side in px (LLaDA-V: 14); a `pad` "
                                   "image fills (vision_image_size / vision_patch_size)^2 + 1 prompt positions")
    vision_hidden_size: int = field(16, ge=1, help="fresh llada_v: SigLIP width (LLaDA-V: 1152)")
    vision_num_heads: int = field(2, ge=1, help="fresh llada_v: SigLIP attention heads (LLaDA-V: 16)")
    vision_num_layers: int = field(3, ge=2, help="fresh llada_v: SigLIP layers as the tower's config counts them "
                                   "(LLaDA-V: 27); as published, the last is deleted, so one fewer runs")
    image_aspect_ratio: Literal["pad", "anyres_max_4"] = field(
        "anyres_max_4", help="fresh llada_v: pad (one tile) or anyres_max_4 (LLaDA-V's tiling over 1x1..6x6 tiles)")
    init_std: float | None = field(
        None, gt=0, help="fresh model: draw every weight matrix (embeddings, projections, head) from "
        "N(0, init_std^2) with a generator seeded by run.seed (null = HF's init, std 0.02). Tiny models without "
        "QK-norm (llada) learn attention far faster from a larger init, e.g. 0.08")
    dtype: str = dtype_field("float32", note="; train.mixed_precision computes in bfloat16 over float32 weights")
    attn_implementation: Literal["sdpa", "eager"] = field("sdpa", help="HF attention kernel")
    gradient_checkpointing: bool = field(False, help="recompute activations in backward (real model sizes)")
    freeze_router: bool = field(False, help="MoE models: no gradient into the routers (gate weights)")
    train_vision: Literal["none", "projector", "all"] = field(
        "none", help="llada_v: which image parts train besides the language model: none (the image features are "
        "data, as the published LLaDA-V SFT computes them), projector (the mlp2x_gelu projector and the image "
        "newline over a frozen tower), all (the SigLIP tower too; LLaVA's mm_tunable_parts "
        "mm_vision_tower,mm_mlp_adapter,mm_language_model). SFT only: dllm-rl dpo refuses it")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.family == "llada_v" and self.vision_image_size % self.vision_patch_size:
            raise ConfigError(f"model.vision_image_size={self.vision_image_size} is not a multiple of "
                              f"model.vision_patch_size={self.vision_patch_size}: SigLIP tiles the image in whole "
                              "patches; pick sizes that divide")
        if self.family == "llada_v" and self.vision_hidden_size % self.vision_num_heads:
            raise ConfigError(f"model.vision_hidden_size={self.vision_hidden_size} is not a multiple of "
                              f"model.vision_num_heads={self.vision_num_heads}")


@dataclass
class TrainConfig(Checked):
    """Loop, batching, precision and logging cadence (where the run writes and its checkpoints: ``run:``)."""

    max_steps: int = field(1000, ge=1, help="optimizer steps (the schedule spans them)")
    num_epochs: float | None = field(None, gt=0, help="if set, max_steps = ceil(num_epochs * examples / global batch)")
    micro_batch_size: int = field(8, ge=1, help="examples per forward/backward on each process (DPO: pairs)")
    grad_accum: int = field(
        1, ge=1, help="micro-batches per optimizer step (global batch = micro_batch_size * grad_accum * world)")
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = field(
        "auto", help="auto = bf16 autocast where the device supports it, else fp32")
    log_every: int = field(10, ge=1, help="write metrics every N optimizer steps")
    stop_after: int | None = field(None, ge=1, help="end this invocation after N steps of the run (the schedule still "
                                              "spans max_steps; resume later with run.resume=auto)")
    num_threads: int | None = field(
        None, ge=1, help="torch CPU threads on a CPU device (null: OMP_NUM_THREADS if set, else the cores that are "
        "free when the run starts, shared among the processes of this machine; dllm_rl/threads.py)")


def _keep_all(value):
    """``train.keep_checkpoints: null`` (keep all) is ``run.keep_checkpoints: 0``."""
    return 0 if value is None or str(value).lower() in ("null", "none") else value


def _cpu_device(value: bool) -> str:
    """``train.cpu: true`` is ``model.device: cpu``; ``false`` is ``auto`` (the accelerator when there is one)."""
    return "cpu" if coerce(value, bool, "train.cpu") else "auto"


def _resume_word(value):
    """``train.resume: none`` is ``run.resume: null``; ``auto`` and a directory keep their meaning."""
    return None if value is None or str(value).lower() in ("none", "null") else value


#: renamed keys of the sections SFT and DPO share (DPOConfig's RENAMED too)
TRAIN_RENAMED: dict = {"train.cpu": ("model.device", _cpu_device), "train.batch_size": "train.micro_batch_size"}


@dataclass
class SFTConfig:
    """``dllm-rl sft [CONFIG.yaml] [key=value | --key value ...]``: supervised fine-tuning of a diffusion LM."""

    #: keys of earlier releases -> their place now (dllm_rl.config.renames)
    RENAMED: ClassVar[dict] = {
        **{f"train.{k}": f"run.{k}" for k in ("output_dir", "seed", "overwrite", "progress", "save_every",
                                               "push_to_hub", "report_to", "distributed_timeout_s")},
        "train.keep_checkpoints": ("run.keep_checkpoints", _keep_all),
        "train.resume": ("run.resume", _resume_word),
        **TRAIN_RENAMED,
    }

    run: RunConfig = field(default_factory=lambda: RunConfig(output_dir="runs/sft"),
                           help="where the run writes, its seed, resume, checkpoints, trackers, hub upload")
    model: ModelConfig = field(default_factory=ModelConfig, help="model and tokenizer")
    data: DataConfig = field(default_factory=DataConfig, help="training data")
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig, help="SFT loss")
    optim: OptimConfig = field(default_factory=OptimConfig, help="AdamW and learning-rate schedule")
    lora: LoraOptions = field(default_factory=LoraOptions, help="LoRA adapters (peft)")
    train: TrainConfig = field(default_factory=TrainConfig, help="loop, batching, precision")
