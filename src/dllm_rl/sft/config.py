"""The SFT run's configuration: ``dllm-rl sft CONFIG.yaml [key=value ...]`` reads an :class:`SFTConfig` (its
sections: the model, data, objective, optimiser, LoRA and the training loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dllm_rl.config import Checked, field
from dllm_rl.hub import check_repo_id
from dllm_rl.sft.data import DataConfig
from dllm_rl.sft.objectives import ObjectiveConfig
from dllm_rl.training import LoraOptions, OptimConfig
from dllm_rl.training.trackers import check_report_to


@dataclass
class ModelConfig(Checked):
    """The model to fine-tune: a published-layout checkpoint, or a fresh tiny model (``path: null``)."""

    path: str | None = field(None, help="checkpoint directory in a published layout (config.json + safetensors) "
                                        "or a hub id org/name[@revision]; "
                                        "null = build a fresh model of `family` from the sizes below")
    tokenizer: str = field("auto", help="auto (the checkpoint's own tokenizer), char (the character tokenizer "
                                        "over `alphabet`), or a tokenizer directory")
    alphabet: str | None = field(None, help="characters of the char tokenizer (null = the default alphabet)")
    words: list[str] = field(default_factory=list, help="char tokenizer: whole strings that get one token each "
                             "(e.g. [\"<answer>\", \"</answer>\"]: shorter completions, cheaper decoding)")
    family: Literal["llada", "dream", "sdar"] = field("llada", help="family of a fresh model (path: null)")
    hidden_size: int = field(128, ge=1, help="fresh model: hidden size")
    num_layers: int = field(4, ge=1, help="fresh model: transformer layers")
    num_heads: int = field(4, ge=1, help="fresh model: attention heads")
    num_kv_heads: int = field(4, ge=1, help="fresh model: key/value heads (GQA when < num_heads)")
    intermediate_size: int = field(384, ge=1, help="fresh model: MLP width")
    block_size: int = field(4, ge=1, help="fresh block model (sdar): block size of block-causal attention")
    max_position_embeddings: int = field(256, ge=1, help="fresh model: context length")
    tie_word_embeddings: bool = field(False, help="fresh model: share input and output embeddings")
    init_std: float | None = field(
        None, gt=0, help="fresh model: draw every weight matrix (embeddings, projections, head) from "
        "N(0, init_std^2) with a generator seeded by train.seed (null = HF's init, std 0.02). Tiny models without "
        "QK-norm (llada) learn attention far faster from a larger init, e.g. 0.08")
    dtype: Literal["float32", "bfloat16"] = field("float32", help="weight dtype (mixed precision keeps fp32 weights)")
    attn_implementation: Literal["sdpa", "eager"] = field("sdpa", help="HF attention kernel")
    gradient_checkpointing: bool = field(False, help="recompute activations in backward (real model sizes)")
    freeze_router: bool = field(False, help="MoE models: no gradient into the routers (gate weights)")


@dataclass
class TrainConfig(Checked):
    """Loop, batching, logging, checkpoints."""

    output_dir: str = field("runs/sft", help="run directory (config, metrics, checkpoints, final model)")
    max_steps: int = field(1000, ge=1, help="optimizer steps (the schedule spans them)")
    num_epochs: float | None = field(None, gt=0, help="if set, max_steps = ceil(num_epochs * examples / global batch)")
    batch_size: int = field(8, ge=1, help="micro-batch size per process")
    grad_accum: int = field(
        1, ge=1, help="micro-batches per optimizer step (global batch = batch_size * grad_accum * world)")
    seed: int = field(0, help="seeds the fresh model, the data order and the masking generator")
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = field(
        "auto", help="auto = bf16 autocast where the device supports it, else fp32")
    log_every: int = field(10, ge=1, help="write metrics every N optimizer steps")
    save_every: int = field(0, ge=0, help="checkpoint every N optimizer steps (0 = final checkpoint only)")
    keep_checkpoints: int | None = field(2, help="keep the N newest checkpoints (null = all)")
    resume: str | None = field(None, help="auto (newest checkpoint in output_dir, if any) or a checkpoint directory")
    overwrite: bool = field(False, help="output_dir already holds a run and resume is not given: delete that run's "
                                        "files (config, metrics, data report, checkpoints, model/, plots) and "
                                        "start afresh (false = refuse to start)")
    stop_after: int | None = field(None, ge=1, help="end this invocation after N steps of the run (the schedule still "
                                              "spans max_steps; resume later with train.resume=auto)")
    num_threads: int | None = field(None, ge=1, help="torch CPU threads (null = torch's default)")
    progress: bool = field(True, help="show the progress bar")
    cpu: bool = field(False, help="force CPU even when an accelerator is present")
    push_to_hub: str | None = field(None, check=check_repo_id,
                                    help="hub repository org/name to upload model/ to at the end (created "
                                    "if missing; needs `hf auth login` or HF_TOKEN)")
    report_to: list[str] = field(default_factory=list, check=check_report_to,
                                 help="experiment trackers for the metrics and the config: tensorboard | wandb | "
                                 "trackio | mlflow | none (a list; tensorboard writes output_dir/tensorboard)")
    distributed_timeout_s: float = field(
        1800.0, gt=0, help="multi-process runs: a collective that waits longer than this ends the run with an "
        "error (a rank that died or hangs); torch's default is 1800 s")


@dataclass
class SFTConfig:
    """``dllm-rl sft CONFIG.yaml [key=value ...]``: supervised fine-tuning of a diffusion LM."""

    model: ModelConfig = field(default_factory=ModelConfig, help="model and tokenizer")
    data: DataConfig = field(default_factory=DataConfig, help="training data")
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig, help="SFT loss")
    optim: OptimConfig = field(default_factory=OptimConfig, help="AdamW and learning-rate schedule")
    lora: LoraOptions = field(default_factory=LoraOptions, help="LoRA adapters (peft)")
    train: TrainConfig = field(default_factory=TrainConfig, help="loop, batching, checkpoints")
