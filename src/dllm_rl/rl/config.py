"""`RLConfig`: every knob of `dllm-rl rl`, with TRL's names where the meaning matches.

Fields left at ``None`` are filled by the algorithm preset (:mod:`dllm_rl.rl.algorithms`); anything set
in the YAML file or on the command line wins over the preset.
"""

from __future__ import annotations

from dataclasses import dataclass

from dllm_rl.config import field
from dllm_rl.models.logprobs import DEFAULT_CHUNK_SIZE
from dllm_rl.training import LoraOptions, OptimConfig


@dataclass
class RolloutConfig:
    """How rollouts are decoded (see :class:`dllm_rl.sampling.DecodeConfig`)."""

    gen_length: int = field(32, help="tokens generated per completion")
    block_length: int | None = field(
        None, help="semi-autoregressive block length for full-attention models (default gen_length); "
        "block models always use their own block_size")
    steps: int | None = field(
        None, help="static decoding: steps per block (default: one token per step). Ignored with threshold")
    threshold: float | None = field(None, help="dynamic decoding: commit every token with confidence > threshold")
    temperature: float = field(1.0, help="sampling temperature for rollouts (0 = greedy)")
    top_k: int = field(0, help="top-k filter for rollouts (0 = off)")
    top_p: float = field(1.0, help="top-p filter for rollouts (1 = off)")
    confidence: str = field("prob", help="which tokens to commit first: prob | margin | entropy | random")
    cache: str = field("prefix", help="KV cache for full-attention models: none | prefix | dual")
    batch_size: int = field(64, help="sequences decoded together")
    dtype: str | None = field(
        None, help="decode rollouts with a copy of the policy in this dtype (bfloat16 | float16 | float32 | auto), "
        "refreshed from the live weights each step; log-probs, updates and the held-out evaluation keep the "
        "policy's dtype. auto: bfloat16 where the device multiplies it natively (CUDA; a CPU with AMX or "
        "AVX512-BF16), else the policy's dtype. Default: the policy itself")
    compile: bool = field(
        False, help="decode rollouts with a torch.compile'd copy of the policy (dynamic shapes: one compile, 10-30 s "
        "on the first step, serves every batch and prompt width; needs a C++ compiler on CPU), refreshed from "
        "the live weights each step like the rollout.dtype copy")


@dataclass
class EvalConfig:
    """Held-out greedy evaluation during and after training.

    It decodes the rollout's window (``rollout.gen_length`` / ``block_length``), order (``confidence``) and
    cache, with its own temperature and schedule (``steps`` / ``threshold`` below).
    """

    every: int = field(0, help="evaluate every N steps (0 = only before and after training)")
    limit: int = field(200, help="held-out items evaluated")
    split: str = field("test", help="split of the task used for evaluation")
    data: str | None = field(None, help="evaluation data file (default: the task's test file)")
    temperature: float = field(0.0, help="decoding temperature for evaluation (0 = greedy)")
    steps: int | None = field(
        None, help="static decoding steps per block for evaluation (default: one token per step; ignored with "
        "threshold). The rollout's schedule (rollout.steps / rollout.threshold) never applies here, so a faster "
        "rollout schedule does not change what the held-out metric measures")
    threshold: float | None = field(
        None, help="dynamic decoding for evaluation: commit every token with confidence > threshold")


@dataclass
class RLConfig:
    """Configuration of an RL run."""

    model: str = field("", help="checkpoint directory in a published layout (config.json + safetensors)")
    tokenizer: str | None = field(None, help="tokenizer directory (default: the model directory)")
    output_dir: str = field("runs/rl", help="where metrics, checkpoints, samples and plots go")
    seed: int = field(0, help="seed of every random stream (prompts, rollouts, estimator masks)")
    dtype: str = field("float32", help="model dtype: float32 | bfloat16 (log-probs and losses stay float32)")
    device: str = field("auto", help="auto | cpu | cuda; under accelerate the process's device")

    # task
    task: str = field("countdown", help="task name (gsm8k | math | countdown | sudoku | code) or a data file")
    train_data: str | None = field(None, help="training data file (default: the task's train file)")
    prompt_style: str = field("chat", help="prompt format of the task: chat | plain | compact")
    train_limit: int | None = field(None, help="use only the first N training examples")
    reward: str | None = field(
        None, help="custom reward 'module:function' with TRL's signature (prompts, completions, **columns) -> "
        "list[float]; replaces the task's built-in reward")

    # algorithm
    algorithm: str = field(
        "espo", help="preset: espo | tracerl | diffu_grpo | coupled_grpo | random_mask_grpo (fills the None fields)")
    estimator: str | None = field(
        None, help="log-likelihood estimator: trace | elbo | mean_field | random_mask | coupled")
    estimator_options: dict | None = field(
        None, help="estimator options, e.g. {shrinkage: 8} (TraceRL's s), {num_mc: 2, coupled: true} (ESPO)")
    loss_type: str | None = field(None, help="policy loss: token (clipped per token) | sequence (ESPO, eq. 7-9)")
    loss_aggregation: str | None = field(None, help="token loss reduction: token_mean | seq_mean | fixed_length")
    estimator_noise: str | None = field(
        None, help="random masks of the estimator: sample (each sample its own) | group (the samples of one "
        "prompt share them: same noise levels and positions, so the group's advantage-weighted gradients on "
        "the tokens its samples share cancel more exactly; each sample's estimate stays unbiased). "
        "Preset: group for espo, sample otherwise")
    epsilon: float = field(0.2, help="PPO clip range (TRL epsilon)")
    epsilon_high: float | None = field(None, help="upper clip range (DAPO clip-higher); default epsilon")
    beta: float | None = field(None, help="KL coefficient against the reference policy (TRL beta; 0 = no reference)")
    kl_estimator: str | None = field(None, help="KL estimator: k1 | k2 (ESPO) | k3 (GRPO)")
    advantage: str | None = field(None, help="advantage rule: group_zscore (GRPO) | leave_one_out (RLOO, ESPO)")
    scale_rewards: str | None = field(None, help="advantage scaling (TRL scale_rewards): group | batch | none")
    drop_zero_variance: bool = field(True, help="drop groups whose rewards are all equal (counted in the logs)")
    accuracy_band: list[float] | None = field(
        None, help="keep only groups with lo <= accuracy <= hi (TraceRL uses [0.2, 0.8])")
    dynamic_sampling: bool = field(
        False, help="DAPO's dynamic sampling: after the groups without signal are dropped (drop_zero_variance, "
        "accuracy_band), roll out further batches of prompts_per_step prompts until prompts_per_step groups with "
        "signal are kept (the surplus of the last batch is dropped) or max_sampling_rounds batches were drawn")
    max_sampling_rounds: int = field(4, help="dynamic_sampling: most prompt batches rolled out per step")
    reference: str = field("copy", help="reference policy: copy (frozen copy of the start weights) | "
                           "base (LoRA adapters disabled; needs lora.enabled)")

    # schedule
    max_steps: int = field(20, help="RL steps (each: rollouts -> rewards -> advantages -> mu passes)")
    prompts_per_step: int = field(16, help="prompts sampled per step (per process)")
    num_generations: int = field(8, help="completions per prompt (TRL num_generations; the group size)")
    num_iterations: int = field(1, help="optimisation passes over each rollout batch (TRL num_iterations, mu)")
    micro_batch_size: int = field(16, help="samples per forward/backward")
    gradient_accumulation_steps: int | None = field(
        None, help="micro-batches per optimizer step (default: the whole rollout batch is one step per pass)")
    max_time_minutes: float | None = field(None, help="stop training after this many minutes (checked per step)")
    max_bad_steps: int = field(3, help="stop after this many updates skipped for a NaN/inf loss")

    ema_decay: float = field(
        0.0, help="weight average of the policy: decay of an EMA updated once per RL step (0 = off; 0.93 is a "
        "half-life of about 10 steps). When on, the held-out evaluations and final/ use the average; rollouts "
        "and updates use the live policy, whose final accuracy is also reported (accuracy_after_live)")
    optim: OptimConfig = field(default_factory=OptimConfig, help="optimizer and schedule")
    lora: LoraOptions = field(default_factory=LoraOptions, help="LoRA (peft) settings; full fine-tuning when off")
    rollout: RolloutConfig = field(default_factory=RolloutConfig, help="rollout decoding")
    eval: EvalConfig = field(default_factory=EvalConfig, help="held-out evaluation")

    # logging and checkpoints
    log_samples_every: int = field(5, help="print a few decoded samples every N steps (0 = never)")
    save_rollouts: int = field(4, help="rollouts per step written to rollouts.jsonl (prompt, completion, reward)")
    save_every: int = field(0, help="checkpoint every N steps (0 = only at the end)")
    keep_checkpoints: int = field(2, help="checkpoints kept on disk")
    resume: str | None = field(None, help="checkpoint directory to resume from, or 'latest'")
    progress: bool = field(True, help="show a progress bar")
    logprob_chunk_size: int = field(
        DEFAULT_CHUNK_SIZE, help="scored positions the LM head projects onto the vocabulary at a time, recomputed "
        "in backward (memory independent of the vocabulary; 0 = all at once)")
