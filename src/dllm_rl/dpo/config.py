"""The preference run's configuration: ``dllm-rl dpo CONFIG.yaml [key=value ...]`` reads a :class:`DPOConfig`: the
SFT sections (``run``, ``model``, ``optim``, ``lora``, ``train``), the pairs' ``data`` and VRPO's knobs at the top."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dllm_rl.config import field
from dllm_rl.models.logprobs import DEFAULT_CHUNK_SIZE
from dllm_rl.sft.config import TRAIN_RENAMED, ModelConfig, TrainConfig
from dllm_rl.sft.data import ResponseFormat
from dllm_rl.training import LoraOptions, OptimConfig
from dllm_rl.training.resume_check import RUN_APPLICABLE
from dllm_rl.training.run_config import RunConfig

#: settings that may change when a dpo run is resumed (they take effect from the resumed step)
DPO_APPLICABLE = RUN_APPLICABLE + (
    "train.max_steps", "train.num_epochs", "train.stop_after", "train.log_every", "train.num_threads", "model.device",
    "logprob_chunk_size", "max_rows", "model.gradient_checkpointing")


@dataclass
class PairDataConfig(ResponseFormat):
    """Where the preference pairs come from and how they become tokens."""

    train_file: str = field("", help="pairs with prompt / chosen / rejected columns: JSON lines, a .csv / .parquet "
                            "table, or a hub dataset hf:org/name[:config]@split (e.g. "
                            "hf:HuggingFaceH4/ultrafeedback_binarized@train_prefs); a chosen / rejected value may be "
                            "chat messages [{role, content}, ...], whose last message is the response")
    prompt_field: str = field("prompt", help="column holding the prompt text")
    chosen_field: str = field("chosen", help="column holding the preferred response")
    rejected_field: str = field("rejected", help="column holding the dispreferred response")


@dataclass
class DPOConfig:
    """``dllm-rl dpo [CONFIG.yaml] [key=value | --key value ...]``: VRPO preference training (LLaDA 1.5,
    arXiv 2505.19223)."""

    #: keys of earlier releases -> their place now (dllm_rl.config.renames)
    RENAMED: ClassVar[dict] = TRAIN_RENAMED

    run: RunConfig = field(default_factory=lambda: RunConfig(output_dir="runs/dpo"),
                           help="where the run writes, its seed, resume, checkpoints, trackers, hub upload")
    model: ModelConfig = field(default_factory=ModelConfig, help="the policy, whose start weights are the reference")
    data: PairDataConfig = field(default_factory=PairDataConfig, help="preference pairs")
    optim: OptimConfig = field(default_factory=OptimConfig, help="AdamW and learning-rate schedule")
    lora: LoraOptions = field(default_factory=LoraOptions,
                              help="LoRA adapters (peft); the base weights are then the reference (no copy)")
    train: TrainConfig = field(default_factory=TrainConfig,
                               help="loop, batching (train.micro_batch_size counts pairs), precision")
    beta: float = field(0.1, gt=0, help="DPO beta: the implicit reward's scale, beta * (B_theta - B_ref) / "
                        "elbo_divisor (VRPO, arXiv 2505.19223; DARE's recipe: 0.2 with elbo_divisor 512)")
    num_mc: int = field(4, ge=1, help="ELBO rows per response (VRPO's budget n, one mask per stratified count: the "
                        "paper's optimal allocation; DARE's recipe 4, the paper's main setting 8); cost: "
                        "2 x num_mc rows per pair for the policy and as many for the reference")
    elbo_divisor: float = field(1.0, gt=0, help="divide every ELBO by this constant (1 = the paper's form; DARE's "
                                "code divides by the padded response length, max_response_length = 512)")
    max_rows: int | None = field(None, ge=1, help="forward at most this many masked rows at once (memory bound)")
    logprob_chunk_size: int = field(
        DEFAULT_CHUNK_SIZE, ge=0, help="scored positions the LM head projects onto the vocabulary at a time, "
        "recomputed in backward (0 = all at once)")
