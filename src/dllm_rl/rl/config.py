"""`RLConfig`: every knob of `dllm-rl rl`, with TRL's names where the meaning matches.

Fields left at ``None`` are filled by the algorithm preset (:mod:`dllm_rl.rl.algorithms`); anything set
in the YAML file or on the command line wins over the preset. Each value is checked when the config is
built (:func:`dllm_rl.config.check_fields`: ``Literal`` choices, registries, ranges); the rules between
fields are checked by :func:`dllm_rl.rl.algorithms.resolve`. Both run before any model is loaded.

The papers behind the method knobs' defaults are named by each method's module (:mod:`dllm_rl.rl.methods`),
from which the help's "Preset:" clauses are derived.

One file on purpose (about 460 lines): it is the one declaration of an RL run's configuration. Its sections are
read together (each help text names keys of the others: ``train.block_size`` against ``rollout.block_size``, the
``eval`` schedule against the rollout's), ``RENAMED`` maps the old flat keys onto all of them, and
``docs/config.md`` is generated from it in this order. The shared pieces live where they are shared: the run
section in :mod:`dllm_rl.training.run_config`, decoding in :mod:`dllm_rl.sampling.config`, the reward section in
:mod:`dllm_rl.rewards.config`, the value model in :mod:`dllm_rl.rl.value_config`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from dllm_rl.config import Checked, ConfigError, FieldError, field
from dllm_rl.config.vocabulary import DTYPES, OLD_DTYPE_NAMES, ModelSection, device_field, dtype_field
from dllm_rl.errors import UserError
from dllm_rl.models.logprobs import DEFAULT_CHUNK_SIZE
from dllm_rl.rewards.config import RewardConfig
from dllm_rl.rl.curriculum_config import CurriculumConfig
from dllm_rl.rl.hooks import NO_HOOK
from dllm_rl.rl.methods import ADVANTAGES, ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES, ROLLOUT_HOOKS
from dllm_rl.rl.presets import PRESETS, algorithm_help, preset_clause
from dllm_rl.rl.value_config import ValueModelConfig
from dllm_rl.sampling.config import UNIFORM_FIELDS, CacheMode, DecodeConfig, DecodeOptions, check_schedule
from dllm_rl.training import LoraOptions, OptimConfig
from dllm_rl.training.run_config import RunConfig


def _preset_help(key: str, text: str) -> str:
    """``text`` and the "Preset: ..." clause of field ``key`` (derived from the methods' declarations)."""
    return f"{text}. {preset_clause(key)}"


def _band_problem(band: list[float]) -> str | None:
    if len(band) != 2 or not 0.0 <= band[0] <= band[1] <= 1.0:
        return f"give two numbers [lo, hi] with 0 <= lo <= hi <= 1, got {band}"
    return None


def _decode_default(name: str, default: Any) -> Any:
    """A :class:`DecodeOptions` field with another default (same help and checks)."""
    base = DecodeOptions.__dataclass_fields__[name]
    return dataclasses.field(default=default, metadata=base.metadata)


def _uniform_field(name: str, unset: str | None = None) -> Any:
    """A uniform-state knob of :class:`DecodeConfig` (None: the stock default; same help and checks). ``unset``: what
    None means here instead, in the help."""
    meta = dict(DecodeConfig.__dataclass_fields__[name].metadata)
    if unset is not None:
        meta["help"] = meta["help"].rpartition(" None: ")[0] + f" None: {unset}."
    return dataclasses.field(default=None, metadata=meta)


@dataclass
class RolloutConfig(DecodeOptions):
    """How rollouts are decoded: the sampler's :class:`~dllm_rl.sampling.config.DecodeOptions` (window,
    schedule, order, sampling, cache) with rollout defaults, plus the group size, the rollout's batching and model
    copy. Like every schedule, ``steps`` and ``threshold`` are exclusive (``sampling.config.SCHEDULE_RULE``)."""

    gen_length: int = _decode_default("gen_length", 32)
    block_length: int | None = field(
        None, ge=1, help="semi-autoregressive block length for full-attention models (default gen_length: one "
        "block); block models always use their own block_size")
    temperature: float = _decode_default("temperature", 1.0)
    cache: CacheMode = _decode_default("cache", "prefix")
    num_generations: int = field(
        8, ge=1, help="completions per prompt (TRL num_generations; the group size G)")
    batch_size: int = field(64, ge=1, help="sequences decoded together")
    dtype: str | None = field(
        None, choices=DTYPES, renamed_values=OLD_DTYPE_NAMES,
        help="decode rollouts with a copy of the policy in this dtype (auto | float32 | bfloat16 | float16), "
        "refreshed from the live weights each step; log-probs, updates and the held-out evaluation keep the "
        "policy's dtype. auto: bfloat16 where the device multiplies it natively (CUDA; a CPU with AMX or "
        "AVX512-BF16), else the policy's dtype. Default: the policy itself")
    compile: bool = field(
        False, help="decode rollouts with a torch.compile'd copy of the policy (dynamic shapes: one compile, 10-30 s "
        "on the first step, serves every batch and prompt width; needs a C++ compiler on CPU), refreshed from "
        "the live weights each step like the rollout.dtype copy")
    block_size: int | None = field(
        None, ge=1, help="block models: the block the rollouts decode in (default the model's block_size); with "
        "train.block_size larger, TraceRL's block-size adaptation")
    engine: bool = field(
        False, help="decode rollouts and the held-out evaluation with the continuous-batching engine, "
        "rollout.batch_size sequences at a time, each finished one replaced at once by a waiting one (the same "
        "tokens as fixed batches, fewer idle rows with threshold decoding or EOS stops). Every family, cache and "
        "remasking (Fast-dLLM's prefix and dual caches, RCR, image prompts, rollout hooks' prefilled tokens, "
        "per-step records and d-TreeRPO's partial trees included); a uniform-state family (diffusion_gemma) canvas "
        "by canvas, each rollout with the tokens and trajectory of fixed batches")
    # uniform-state diffusion (DiffusionGemma) only, as in DecodeConfig: a masked family refuses them, and a uniform
    # family refuses the mask-only knobs above at any value but their defaults (decode_config)
    max_denoising_steps: int | None = _uniform_field("max_denoising_steps")
    t_min: float | None = _uniform_field("t_min")
    t_max: float | None = _uniform_field("t_max")
    entropy_bound: float | None = _uniform_field("entropy_bound")
    stability_threshold: int | None = _uniform_field("stability_threshold")
    confidence_threshold: float | None = _uniform_field("confidence_threshold")
    final_tokens: str | None = _uniform_field("final_tokens")
    # DiFFPO's learned per-prompt threshold (dllm_rl.rl.learned_threshold, dllm_rl.sampling.threshold_head)
    decoding: str = field(
        "config", choices=("config", "learned"),
        help="config: the schedule set here (steps / threshold); learned: DiFFPO's per-prompt threshold (arXiv "
        "2510.02212), each sample decoded with the dynamic schedule at a threshold drawn from a small head on the "
        "prompt's mean hidden state, the head trained with the policy by the policy gradient on the same "
        "advantages and saved next to the model (threshold_head.safetensors; dllm-rl generate --decoding learned)")
    learned_range: list[float] = field(
        default_factory=lambda: [0.5, 1.0],
        help="decoding=learned: the thresholds the head may choose, [t_min, t_max] with 0 < t_min < t_max <= 1")
    learned_sigma: float = field(
        0.5, gt=0, help="decoding=learned: the spread of the head's logit-normal draw (the logit's standard deviation)")
    learned_lr: float = field(0.01, gt=0, help="decoding=learned: the head's learning rate (Adam)")


@dataclass
class HeldOutConfig(Checked):
    """Held-out greedy evaluation during and after training (the ``eval:`` section of an RL config).

    It decodes the rollout's window (``rollout.gen_length`` / ``block_length``), order (``confidence``) and
    cache, with its own temperature and schedule (``steps`` / ``threshold`` below).
    """

    every: int = field(0, ge=0, help="evaluate every N steps (0 = only before and after training)")
    limit: int = field(
        200, ge=0, help="held-out items evaluated (0 = no held-out evaluation at all; otherwise an evaluation "
        "data file without items is an error)")
    split: str = field("test", help="split of the task used for evaluation")
    data: str | None = field(None, help="evaluation data file (default: the task's test file)")
    temperature: float = field(0.0, ge=0, help="decoding temperature for evaluation (0 = greedy)")
    steps: int | None = field(
        None, ge=1, help="static decoding steps per block for evaluation (default: one token per step; not with "
        "threshold). The rollout's schedule (rollout.steps / rollout.threshold) never applies here, so a "
        "faster rollout schedule does not change what the held-out metric measures")
    threshold: float | None = field(
        None, gt=0, le=1, help="dynamic decoding for evaluation: commit every token with confidence > threshold")
    # uniform-state families (DiffusionGemma) only: the evaluation's own sampler knobs (None: the rollout's), so that
    # rollouts may explore hotter, or accept surer-or-not draws, apart from how the held-out metric decodes (as masked
    # rollouts sample at rollout.temperature beside a greedy evaluation)
    max_denoising_steps: int | None = _uniform_field("max_denoising_steps", "the rollout's")
    t_min: float | None = _uniform_field("t_min", "the rollout's")
    t_max: float | None = _uniform_field("t_max", "the rollout's")
    entropy_bound: float | None = _uniform_field("entropy_bound", "the rollout's")
    stability_threshold: int | None = _uniform_field("stability_threshold", "the rollout's")
    confidence_threshold: float | None = _uniform_field("confidence_threshold", "the rollout's")
    final_tokens: str | None = _uniform_field("final_tokens", "the rollout's")
    block_size: int | None = field(
        None, ge=1, help="block models: the block the held-out evaluation decodes in (default rollout.block_size)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_schedule(self.steps, self.threshold)


@dataclass
class RLModelConfig(ModelSection):
    """The policy to train (the ``model:`` section of an RL config): the shared model keys, float32 weights by
    default, and the policy's own."""

    path: str = field("", help="checkpoint directory in a published layout (config.json + safetensors), or a "
                       "hub id org/name[@revision] (HF cache; HF_HUB_OFFLINE=1 reads only the cache)")
    dtype: str = dtype_field("float32", what="the policy's weights", note="; log-probs and losses stay float32")
    device: str = device_field(what="the policy")
    freeze_router: bool = field(
        False, help="MoE models: no gradient into the routers (gate weights), the usual practice in MoE RL. The "
        "auxiliary load-balancing loss is never added in RL (router load and entropy are logged as moe_* metrics)")
    logprob_chunk_size: int = field(
        DEFAULT_CHUNK_SIZE, ge=0, help="scored positions the LM head projects onto the vocabulary at a time, "
        "recomputed "
        "in backward (memory independent of the vocabulary; 0 = all at once)")
    gradient_checkpointing: bool = field(
        False, help="recompute each decoder layer in backward (HF activation checkpointing): an update then keeps "
        "only the layers' inputs of the rows it scores, which estimators with many rows per sample need at real "
        "model sizes (cj_grpo: one forward per decoding step)")


@dataclass
class RLDataConfig(Checked):
    """The training prompts (the ``data:`` section): a task, or a data file of one."""

    task: str = field("countdown", help="task name (gsm8k | math | countdown | sudoku | code) or a data file")
    train_file: str | None = field(None, help="training data file (default: the task's train file)")
    prompt_style: Literal["chat", "plain", "compact"] = field("chat", help="prompt format of the task")
    train_limit: int | None = field(None, ge=0, help="use only the first N training examples")


@dataclass
class RLTrainConfig(Checked):
    """The optimisation loop (the ``train:`` section): steps, batches, passes, guards, the weight average and
    the training layout's block."""

    max_steps: int = field(20, ge=1, help="RL steps (each: rollouts -> rewards -> advantages -> mu passes)")
    prompts_per_step: int = field(16, ge=1, help="prompts sampled per step (per process)")
    num_iterations: int = field(
        1, ge=1, help="optimisation passes over each rollout batch (TRL num_iterations, GRPO's mu, arXiv "
        "2402.03300; 1 = on-policy)")
    micro_batch_size: int = field(16, ge=1, help="samples per forward/backward")
    step_chunk_size: int = field(
        0, ge=0, help="estimator=trajectory (uniform-state families): back-propagate the policy loss this many "
        "replayed steps at a time, so an update holds one chunk's graph (costs one more replay without gradient); "
        "0 = every step's graph at once")
    gradient_accumulation_steps: int | None = field(
        None, ge=1, help="micro-batches per optimizer step (default: the whole rollout batch is one step per pass)")
    max_time_minutes: float | None = field(
        None, gt=0, help="stop training after this many minutes (checked per step)")
    num_threads: int | None = field(
        None, ge=1, help="torch CPU threads on a CPU device (null: OMP_NUM_THREADS if set, else the cores that are "
        "free when the run starts, shared among the processes of this machine; dllm_rl/threads.py)")
    max_bad_steps: int = field(3, ge=1, help="stop after this many updates skipped for a NaN/inf loss")
    max_skipped_steps: int = field(
        20, ge=0, help="stop after this many steps in a row without an update because no prompt group had reward "
        "signal (every group's rewards equal, or outside accuracy_band: e.g. rollout.temperature=0 decodes a "
        "group's samples alike, or a constant reward); each such step is warned about. 0 = never stop")
    ema_decay: float = field(
        0.0, ge=0, lt=1, help="weight average of the policy: decay of an EMA updated once per RL step, or as "
        "ema_start / ema_every say (0 = off; 0.93 is a half-life of about 10 updates). When on, the held-out "
        "evaluations and final/ use the average; rollouts and updates use the live policy, whose final accuracy "
        "is also reported (accuracy_after_live)")
    ema_start: int = field(
        0, ge=0, help="the weight average takes only the weights of the steps after this one (0: from the first "
        "step; SWA's swa_start); until its first update, evaluations and final/ use the live policy")
    ema_every: int = field(
        1, ge=1, help="the weight average takes the weights after every N-th step counted from ema_start (SWA's "
        "swa_freq): ema_start 60, ema_every 20 and a decay whose horizon 1 / (1 - ema_decay) exceeds the updates "
        "return the plain mean of the weights after steps 80, 100 and 120 (the block demo's ESPO recipe)")
    block_size: int | None = field(
        None, ge=1, help="block models: the block of the training layout (trace rows, two-stream layout); default "
        "rollout.block_size. A multiple of the rollout block: roll out at B, train at B' (TraceRL's block-size "
        "adaptation, src/dllm_rl/assets/demo/rl-block8.yaml)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ema_decay == 0 and (self.ema_start or self.ema_every != 1):
            raise FieldError("ema_start" if self.ema_start else "ema_every",
                             "shapes the weight average, which is off: set train.ema_decay as well (e.g. 0.9), "
                             "or, to turn the average off, train.ema_start=0 train.ema_every=1 too")


@dataclass
class LogConfig(Checked):
    """What an RL run prints and keeps besides its metrics (the ``log:`` section)."""

    samples_every: int = field(5, ge=0, help="print a few decoded samples every N steps (0 = never)")
    rollouts: int = field(
        4, ge=0, help="rollouts per step written to rollouts.jsonl (prompt, completion, reward)")
    dashboard: bool = field(True, help="draw OUTPUT_DIR/dashboard.png at the end (matplotlib, about a CPU-second; "
                            "`dllm-rl plot OUTPUT_DIR` draws it later)")


@dataclass
class RLConfig(Checked):
    """Configuration of an RL run: the shared ``run:`` section, the policy (``model:``), its prompts (``data:``) and
    their scoring (``reward:``); the method at the top level (``algorithm`` and the knobs its preset fills); then
    ``train:`` / ``optim:`` / ``lora:`` (the update), ``rollout:`` (generation), ``eval:`` (held-out accuracy),
    ``log:``, ``value_model:`` and ``curriculum:``."""

    #: keys of the flat layout of earlier releases -> their place now (dllm_rl.config.renames)
    RENAMED: ClassVar[dict[str, str]] = {
        "output_dir": "run.output_dir",
        "seed": "run.seed",
        "distributed_timeout_s": "run.distributed_timeout_s",
        "resume": "run.resume",
        "overwrite": "run.overwrite",
        "progress": "run.progress",
        "push_to_hub": "run.push_to_hub",
        "report_to": "run.report_to",
        "save_every": "run.save_every",
        "keep_checkpoints": "run.keep_checkpoints",
        "model": "model.path",
        "tokenizer": "model.tokenizer",
        "dtype": "model.dtype",
        "device": "model.device",
        "freeze_router": "model.freeze_router",
        "logprob_chunk_size": "model.logprob_chunk_size",
        "task": "data.task",
        "train_data": "data.train_file",
        "prompt_style": "data.prompt_style",
        "train_limit": "data.train_limit",
        "reward": "reward.function",
        "reward_timeout_s": "reward.timeout_s",
        "max_reward_failure_steps": "reward.max_failure_steps",
        "max_steps": "train.max_steps",
        "prompts_per_step": "train.prompts_per_step",
        "num_generations": "rollout.num_generations",
        "num_iterations": "train.num_iterations",
        "micro_batch_size": "train.micro_batch_size",
        "gradient_accumulation_steps": "train.gradient_accumulation_steps",
        "max_time_minutes": "train.max_time_minutes",
        "max_bad_steps": "train.max_bad_steps",
        "max_skipped_steps": "train.max_skipped_steps",
        "ema_decay": "train.ema_decay",
        "train_block_size": "train.block_size",
        "log_samples_every": "log.samples_every",
        "save_rollouts": "log.rollouts",
    }

    run: RunConfig = field(default_factory=lambda: RunConfig(output_dir="runs/rl"),
                           help="where the run writes, its seed, resume, checkpoints, trackers, hub upload")
    model: RLModelConfig = field(default_factory=RLModelConfig, help="the policy")
    data: RLDataConfig = field(default_factory=RLDataConfig, help="training prompts")
    reward: RewardConfig = field(default_factory=RewardConfig, help="scoring of completions")

    # the method (None: the preset's value; each method's module in rl/methods/ says where its values come from)
    algorithm: str = field(
        "espo", choices=PRESETS, help=algorithm_help())
    estimator: str | None = field(
        None, choices=ESTIMATORS,
        help=_preset_help("estimator", "log-likelihood estimator (dllm_rl.estimators)"))
    estimator_options: dict | None = field(
        None, help=_preset_help("estimator_options", "estimator options (the trace estimator's shrinkage s defaults "
                                "to TraceRL's: 1 on block models, 8 on full attention; its step_merge: true makes "
                                "each decoding block one transition, at the rollout's block_length)"))
    loss_type: str | None = field(
        None, choices=POLICY_LOSSES,
        help=_preset_help("loss_type", "policy loss: token (PPO/GRPO clipping per token, arXiv 2402.03300) | "
                          "sequence (ESPO's sequence-level ratio, arXiv 2512.03759 eq. 7-9) | a method's own"))
    loss_options: dict | None = field(None, help=_preset_help("loss_options", "settings of the chosen loss"))
    rollout_hook: str | None = field(
        None, choices=lambda: (NO_HOOK, *ROLLOUT_HOOKS),
        help=_preset_help("rollout_hook", "hook called after each round's rewards that may replace rollouts "
                          "(dllm_rl.rl.hooks); off: no hook, also where the algorithm's preset has one (its "
                          "rollout_hook_options are then not filled in)"))
    rollout_hook_options: dict | None = field(
        None, help=_preset_help("rollout_hook_options", "options of rollout_hook"))
    inpaint_entropy_keep: float | None = field(
        None, gt=0, le=1, help=_preset_help(
            "inpaint_entropy_keep", "fraction of each sample's inpainted completion tokens (a rollout hook's, "
            "IGPO's hints) that train: the max(1, floor(fraction x n)) of its n with the highest predictive entropy "
            "under the estimator's masks; the others leave the loss only (IGPO's entropy filter, arXiv 2509.10396; "
            "none or 1 = all train)"))
    loss_aggregation: Literal["token_mean", "seq_mean", "fixed_length"] | None = field(
        None, help=_preset_help("loss_aggregation", "token loss reduction: token_mean (DAPO's token-level mean, "
                                "arXiv 2503.14476) | seq_mean (GRPO's 1/|o_i| per sequence, arXiv 2402.03300) | "
                                "fixed_length (sum / generation length, Dr. GRPO arXiv 2503.20783)"))
    estimator_noise: Literal["sample", "group"] | None = field(
        None, help=_preset_help(
            "estimator_noise", "random masks of the estimator: sample (each sample its own) | group (the samples "
            "of one prompt share them: same noise levels and positions, so the group's advantage-weighted "
            "gradients on the tokens its samples share cancel more exactly; each sample's estimate stays unbiased; "
            "ESPO's, this library's choice, benchmarks/LEARNING.md)"))
    epsilon: float | None = field(
        None, ge=0, help=_preset_help("epsilon", "PPO clip range (TRL epsilon; 0.2 as in PPO, arXiv 1707.06347, and "
                                      "GRPO, arXiv 2402.03300)"))
    epsilon_high: float | None = field(
        None, ge=0, help=_preset_help("epsilon_high", "upper clip range (DAPO clip-higher, arXiv 2503.14476, which "
                                      "uses 0.28); none: epsilon"))
    beta: float | None = field(
        None, ge=0, help=_preset_help("beta", "KL coefficient against the reference policy (TRL beta; 0 = no "
                                      "reference; the demo configs set 0), added once at the level the loss "
                                      "declares (token or sequence)"))
    kl_estimator: str | None = field(
        None, choices=KL_ESTIMATORS,
        help=_preset_help("kl_estimator", "KL estimator: k1 | k2 (ESPO, arXiv 2512.03759) | k3 (GRPO, arXiv "
                          "2402.03300)"))
    advantage: str | None = field(
        None, choices=ADVANTAGES,
        help=_preset_help("advantage", "advantage rule: group_zscore (GRPO, arXiv 2402.03300) | leave_one_out "
                          "(RLOO, as in ESPO, arXiv 2512.03759) | pass_at_k (Pass@k training, arXiv 2508.10751; "
                          "advantage_options) | raft (the right answers only, weight 1, the rest leave the update: "
                          "RAFT, arXiv 2304.06767; advantage_options {min_reward: 1.0}) | a method's own"))
    advantage_options: dict | None = field(
        None, help="the advantage rule's options, e.g. {k: 4} for pass_at_k (Pass@k training, arXiv 2508.10751: "
        "each sample's share in its group's best-of-k, which leans the update to the prompts the policy rarely "
        "solves; k in [1, rollout.num_generations], default 4)")
    scale_rewards: Literal["group", "batch", "none"] | None = field(
        None, help=_preset_help("scale_rewards", "advantage scaling (TRL scale_rewards): group (GRPO's per-group "
                                "std, arXiv 2402.03300) | batch | none"))
    drop_zero_variance: bool = field(
        True, help="drop groups whose rewards are all equal (no GRPO signal; DAPO, arXiv 2503.14476, filters "
        "them too); counted in the logs")
    accuracy_band: list[float] | None = field(
        None, check=_band_problem,
        help="keep only groups with lo <= accuracy <= hi (TraceRL, arXiv 2509.06949, uses [0.2, 0.8])")
    dynamic_sampling: bool = field(
        False, help="DAPO's dynamic sampling (arXiv 2503.14476): after the groups without signal are dropped "
        "(drop_zero_variance, accuracy_band), roll out further batches of train.prompts_per_step prompts until "
        "train.prompts_per_step groups with signal are kept (the surplus of the last batch is dropped) or "
        "max_sampling_rounds batches were drawn")
    max_sampling_rounds: int = field(4, ge=1, help="dynamic_sampling: most prompt batches rolled out per step")
    tpf_spread: float | None = field(
        None, ge=0, help="LightningRL's TPF-aware filter (arXiv 2603.13319 Eq. 11): keep only groups with at least "
        "one right answer whose tokens per forward spread (max - min) is at least this (the paper: 0.01); with "
        "dynamic_sampling, roll out further prompts until enough groups pass. null = off")
    reference: Literal["copy", "base"] = field(
        "copy", help="reference policy: copy (frozen copy of the start weights) | base (LoRA adapters disabled; "
        "needs lora.enabled)")

    train: RLTrainConfig = field(default_factory=RLTrainConfig, help="optimisation loop")
    optim: OptimConfig = field(default_factory=OptimConfig, help="optimizer and schedule")
    lora: LoraOptions = field(default_factory=LoraOptions, help="LoRA (peft) settings; full fine-tuning when off")
    rollout: RolloutConfig = field(default_factory=RolloutConfig, help="rollout decoding")
    eval: HeldOutConfig = field(default_factory=HeldOutConfig, help="held-out evaluation")
    log: LogConfig = field(default_factory=LogConfig, help="printed samples and saved rollouts")
    value_model: ValueModelConfig = field(
        default_factory=ValueModelConfig, help="TraceRL's diffusion value model (GAE token advantages)")
    curriculum: CurriculumConfig = field(
        default_factory=CurriculumConfig, help="stages that change the data, generation length, block size, "
        "temperature and advantage rule at a step or once the rolling reward passes a threshold; online "
        "difficulty filtering")


def rollout_engine(cfg: RLConfig):
    """The continuous-batching engine's settings for rollouts and the held-out evaluation (``rollout.engine``;
    ``rollout.batch_size`` slots), or None for fixed batches."""
    from dllm_rl.sampling.engine import EngineConfig

    return EngineConfig(slots=cfg.rollout.batch_size) if cfg.rollout.engine else None


def decode_config(cfg: RLConfig, model, *, evaluation: bool = False) -> DecodeConfig:
    """The sampler settings for rollouts, or (``evaluation``) for the held-out evaluation: the same window,
    order and cache, at ``eval.temperature`` and on the evaluation's own schedule. A block model decodes at the
    rollout's block (``rollout.block_size``) or the evaluation's (``eval.block_size``), given to the sampler as
    ``DecodeConfig.block_size``."""
    from dllm_rl.rl.block_size import run_block_sizes
    from dllm_rl.sampling.inputs import uniform_noise

    if uniform_noise(model):
        return _uniform_decode_config(cfg, model, evaluation)
    r = cfg.rollout
    given = [(f"rollout.{k}", getattr(r, k)) for k in UNIFORM_FIELDS]
    given += [(f"eval.{k}", getattr(cfg.eval, k)) for k in UNIFORM_FIELDS]
    for key, value in given:
        if value is not None:
            raise ConfigError(f"{key}={value!r} is a uniform-state diffusion option (DiffusionGemma); "
                              f"{model.family.name} is masked diffusion: drop {key}")
    schedule = cfg.eval if evaluation else r
    rollout_block, _, eval_block = run_block_sizes(cfg, model.block_size)
    block_size = eval_block if evaluation else rollout_block  # None for full attention
    block = block_size if model.is_block_causal else (r.block_length or r.gen_length)
    steps = None if schedule.threshold is not None else (schedule.steps or block)
    if r.gen_length % block:
        key = "the model's block_size" if block_size == model.block_size else (
            "eval.block_size" if evaluation and cfg.eval.block_size else "rollout.block_size")
        what = f"{key} ({block})" if model.is_block_causal else f"rollout.block_length ({block})"
        raise ConfigError(f"rollout.gen_length: {r.gen_length} is not a multiple of {what}")
    if r.sub_block is not None and schedule.threshold is None:
        where = "eval.threshold" if evaluation else "rollout.threshold"
        raise ConfigError(f"rollout.sub_block ({r.sub_block}) needs the dynamic schedule here: set {where}")
    config = DecodeConfig(gen_length=r.gen_length, block_length=block, block_size=block_size, steps=steps,
                          threshold=schedule.threshold, sub_block=r.sub_block,
                          confidence=r.confidence, temperature=cfg.eval.temperature if evaluation else r.temperature,
                          top_k=r.top_k, top_p=r.top_p, cache=r.cache, remasking=r.remasking)
    return config


#: the held-out evaluation's masked-decoding keys (a uniform family decodes the evaluation as its rollouts)
_EVAL_MASK_FIELDS = ("temperature", "steps", "threshold", "block_size")


def _uniform_decode_config(cfg: RLConfig, model, evaluation: bool = False) -> DecodeConfig:
    """The sampler settings of a uniform-state family (DiffusionGemma), rollouts and held-out evaluation alike (its
    stock sampler has no greedy mode): ``rollout.gen_length`` and the uniform knobs, the evaluation at its own
    knobs where ``eval.<knob>`` is set (``eval.t_min``, ``eval.entropy_bound``, ...). A mask-only key of ``rollout``
    or ``eval`` at any value but its default is refused in one line (``rollout.engine`` decodes them canvas by
    canvas, each rollout as in fixed batches: :mod:`~dllm_rl.sampling.uniform_engine`); the defaults themselves
    (``rollout.temperature`` 1.0, ``rollout.cache`` prefix) are not the user's and are not read."""
    from dllm_rl.sampling.inputs import MASK_FIELDS

    name, r = model.family.name, cfg.rollout
    given = [(f"rollout.{k}", getattr(r, k)) for k in MASK_FIELDS
             if getattr(r, k) != RolloutConfig.__dataclass_fields__[k].default]
    given += [(f"eval.{k}", getattr(cfg.eval, k)) for k in _EVAL_MASK_FIELDS
              if getattr(cfg.eval, k) != HeldOutConfig.__dataclass_fields__[k].default]
    if given:
        key, value = given[0]
        knobs = ", rollout.".join(UNIFORM_FIELDS)
        raise ConfigError(f"{key}={value!r} is a masked-diffusion option; {name} is uniform-state diffusion (no mask "
                          f"token) and decodes with rollout.gen_length and rollout.{knobs}: drop {key}")
    canvas = model.layout_block()
    if r.gen_length % canvas:
        raise ConfigError(f"rollout.gen_length: {r.gen_length} is not a multiple of the model's canvas_length "
                          f"({canvas}); {name} decodes whole canvases")
    knobs = {k: getattr(r, k) for k in UNIFORM_FIELDS}
    own = {k: getattr(cfg.eval, k) for k in UNIFORM_FIELDS if evaluation and getattr(cfg.eval, k) is not None}
    config = DecodeConfig(gen_length=r.gen_length, **{**knobs, **own})
    from dllm_rl.sampling.inputs import uniform_decode_config

    try:
        uniform_decode_config(config)  # t_max above t_min, with the stock defaults where unset
    except UserError as exc:
        raise ConfigError(f"{'eval' if own else 'rollout'}.{exc}") from None
    return config
