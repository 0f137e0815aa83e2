"""`DecodeConfig`: every knob of the sampler, with its invariants checked at construction.

:class:`DecodeOptions` holds the knobs of a decoding (window, schedule, order, sampling, cache) that the RL
rollout section (:class:`dllm_rl.rl.config.RolloutConfig`) shares; :class:`DecodeConfig` adds what only a
direct call of the sampler sets; :class:`PresetDecodeConfig` is a command's ``decode:`` section (with a named
preset) and :class:`GenerateConfig` the whole of ``dllm-rl generate``. Single values are checked by
:func:`dllm_rl.config.check_fields` from the field declarations; checks that need the model (``gen_length`` against
the block size, the context length) run in :func:`dllm_rl.sampling.generate` before any forward pass.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import ClassVar, Literal

from dllm_rl.config import Checked, FieldError, check_fields, field
from dllm_rl.config.vocabulary import ModelSection

Confidence = Literal["prob", "margin", "entropy", "random"]
CacheMode = Literal["none", "prefix", "dual"]
Remasking = Literal["low_confidence", "rcr"]
CONFIDENCE_RULES: tuple[str, ...] = typing.get_args(Confidence)
CACHE_MODES: tuple[str, ...] = typing.get_args(CacheMode)
REMASKING_RULES: tuple[str, ...] = typing.get_args(Remasking)


#: ``decoding``, of ``dllm-rl generate`` and ``dllm-rl eval``: the decode keys' schedule, or the checkpoint's learned
#: per-prompt threshold (:mod:`dllm_rl.sampling.threshold_head`)
DECODINGS = ("config", "learned")
DECODING_HELP = ("config: the schedule the decode keys set; learned: each prompt decoded with the dynamic schedule at "
                 "its own threshold, chosen by the threshold head an RL run with rollout.decoding=learned saved next "
                 "to the model (DiFFPO, dllm_rl.sampling.threshold_head); a checkpoint without one is refused")

#: the one rule of a decoding schedule, wherever one is given (the sampler, RL's rollout and held-out sections, eval
#: settings): a static schedule (``steps``; eval's ``tokens_per_step`` too) or a dynamic one (``threshold``), never both
SCHEDULE_RULE = "set either steps (static schedule) or threshold (dynamic schedule), not both"


def check_schedule(steps: int | None, threshold: float | None) -> None:
    """Raise :class:`FieldError` on ``threshold`` when both schedules are given (:data:`SCHEDULE_RULE`)."""
    if threshold is not None and steps is not None:
        raise FieldError("threshold", SCHEDULE_RULE)


@dataclass
class DecodeOptions(Checked):
    """How to turn masks into tokens (LLaDA / Fast-dLLM / SDAR decoding, see the module docs of `decode`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_schedule(self.steps, self.threshold)
        if self.remasking == "rcr" and self.threshold is not None:
            raise FieldError("remasking", "rcr re-masks on the static schedule: set steps, not threshold")

    gen_length: int = field(
        64, ge=1,
        help="Completion length in tokens; a multiple of the decoding block. Block models round each row up so "
        "the sequence ends on a block boundary (SDAR's rule): a prompt whose last block is partial gets "
        "gen_length + block_size - (prompt_len % block_size) tokens.",
    )
    block_length: int = field(
        32, ge=1,
        help="Semi-autoregressive block length for full-attention models (LLaDA `block_length`). Block models "
        "(SDAR/TraDo) decode in their attention block, `block_size`, and ignore this value.",
    )
    block_size: int | None = field(
        None, ge=1,
        help="Block models (SDAR/TraDo): the attention block to decode in, which is also the decoding block "
        "(None: the model's own block_size; TraceRL's block-size adaptation evaluates at a larger one). "
        "Full-attention models have no attention block and refuse it (their decoding block is block_length).",
    )
    steps: int | None = field(
        None, ge=1,
        help="Static schedule: denoising steps PER BLOCK (LLaDA uses steps // num_blocks; we take it per block). "
        "The masked tokens of a block are split as evenly as possible over the steps, earlier steps taking the "
        "remainder. None (and no threshold): one token per step.",
    )
    threshold: float | None = field(
        None, gt=0, le=1,
        help="Dynamic schedule (Fast-dLLM parallel decoding / SDAR `low_confidence_dynamic`): each step commits "
        "every masked token of the block whose confidence is > threshold, and at least the most confident one. "
        "In (0, 1].",
    )
    sub_block: int | None = field(
        None, ge=1,
        help="Fast-dLLM v2's sub-blocks: inside each decoding block, commit only in the first sub-block of this many "
        "slots (counted from the block's start) that still holds masks, so sub-blocks finish left to right; the "
        "model still reads the whole block. Needs the dynamic schedule (threshold) and must divide the decoding "
        "block. None: the whole block at once.",
    )
    confidence: Confidence = field(
        "prob",
        help="Which masked tokens to commit first: prob (softmax probability of the chosen token, LLaDA "
        "low-confidence remasking), margin (top-1 minus top-2 probability, Dream `topk_margin`), entropy "
        "(exp(-H), i.e. Dream's negative-entropy rule mapped into (0, 1]) or random (uniform scores, LLaDA "
        "`random` remasking).",
    )
    temperature: float = field(
        0.0, ge=0,
        help="Sampling temperature; 0 = greedy argmax. Otherwise Gumbel-max sampling of softmax(logits / T) with "
        "noise drawn in float64 from each sequence's own generator (LLaDA `add_gumbel_noise`).",
    )
    top_k: int = field(
        0, ge=0, help="Keep only the k most likely tokens before sampling (0 = off; no effect when greedy).")
    top_p: float = field(
        1.0, gt=0, le=1,
        help="Nucleus sampling: keep the smallest set of tokens with mass >= top_p (1 = off; no effect when greedy).",
    )
    remasking: Remasking = field(
        "low_confidence",
        help="What happens to committed tokens: low_confidence (they stay, LLaDA) or rcr (MDPO's Running-Confidence "
        "Remasking, arXiv 2508.13148: each step fills every masked slot of the block, then re-masks the slots of "
        "lowest running confidence, the confidence each token had when last sampled, so that as many stay as the "
        "static schedule has committed so far; only slots of the current block are re-masked). rcr needs the "
        "static schedule (steps).",
    )
    cache: CacheMode = field(
        "none",
        help="KV cache for full-attention models: none (recompute everything, LLaDA reference), prefix (Fast-dLLM "
        "prefix cache, refreshed at each block) or dual (Fast-dLLM dual cache: prefix and masked suffix). Both "
        "are Fast-dLLM's approximation. Block models always cache finished blocks, exactly, whatever this says.",
    )


@dataclass
class DecodeConfig(DecodeOptions):
    """The sampler's whole configuration: :class:`DecodeOptions` plus EOS stopping and the seed. ``steps``
    (static schedule) and ``threshold`` (dynamic schedule) are exclusive."""

    stop_on_eos: bool = field(
        True,
        help="Stop a sequence once a fully decoded block holds only EOS (any of the model's EOS ids)/pad in its "
        "completion part; the rest of the completion is filled with EOS (never generated: step_map -1).",
    )
    seed: int = field(0, help="Sequence i uses torch.Generator seeded with seed + i unless `seeds` are given.")
    # Uniform-state diffusion (DiffusionGemma) only: the stock sampler's knobs (dllm_rl.sampling.uniform), None =
    # its default. A masked family refuses them, as a uniform family refuses the mask-only knobs above
    # (dllm_rl.sampling.inputs.check_config); gen_length is its completion budget, whole canvases.
    max_denoising_steps: int | None = field(
        None, ge=1, help="Uniform-state only (DiffusionGemma): denoising steps per canvas at most; adaptive stopping "
        "may end a row sooner. None: 48, the stock default.")
    t_min: float | None = field(
        None, ge=0, help="Uniform-state only: temperature at the last step of the linear schedule. None: 0.4.")
    t_max: float | None = field(
        None, ge=0, help="Uniform-state only: temperature at the first step of the linear schedule, above t_min. "
        "None: 0.8.")
    entropy_bound: float | None = field(
        None, gt=0, help="Uniform-state only: each step accepts the lowest-entropy positions while their entropy "
        "sum less the largest stays at most this (arXiv 2505.24857) and re-noises the rest. None: 0.1.")
    stability_threshold: int | None = field(
        None, ge=0, help="Uniform-state only, adaptive stopping: steps for which a row's argmax canvas must be "
        "unchanged (0: no such condition). None: 1.")
    confidence_threshold: float | None = field(
        None, ge=0, help="Uniform-state only, adaptive stopping: a row's mean entropy must be below this (0: no "
        "adaptive stopping, every row takes max_denoising_steps). None: 0.005.")
    final_tokens: str | None = field(
        None, choices=("argmax", "sampled", None),
        help="Uniform-state only: what a canvas keeps at a row's last step: argmax (stock) or sampled (that step's "
        "draws at every position, each counted by RL's trajectory log-probability). None: argmax.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sub_block is not None and self.threshold is None:
            raise FieldError("sub_block", "sub-blocks need the dynamic schedule: set threshold (Fast-dLLM v2 uses 0.9)")


#: the DecodeConfig fields only uniform-state diffusion reads (None: the stock default)
UNIFORM_FIELDS: tuple[str, ...] = ("max_denoising_steps", "t_min", "t_max", "entropy_bound", "stability_threshold",
                                   "confidence_threshold", "final_tokens")


def _preset_names() -> tuple[str, ...]:
    from dllm_rl.sampling.presets import PRESETS

    return tuple(PRESETS)


@dataclass
class PresetDecodeConfig(DecodeConfig):
    """A command's ``decode:`` section (``generate``, ``serve``): :class:`DecodeConfig` and a named preset, whose
    values fill every key left at its default before the section's rules are checked (so ``preset=fast_dllm_v2
    sub_block=16`` is Fast-dLLM v2's threshold with 16-token sub-blocks). :meth:`decode_config` is the sampler's."""

    preset: str | None = field(None, choices=_preset_names,
                               help="a family's published sampler defaults (dllm_rl.sampling.presets); the decode "
                               "keys given override it")

    def __post_init__(self) -> None:
        if self.preset is not None:
            from dllm_rl.sampling.presets import preset

            check_fields(self)  # the preset's name (and the values given) before they are combined
            defaults = {f.name: f.default for f in dataclasses.fields(DecodeConfig)}
            for key, value in preset(self.preset).items():
                if getattr(self, key) == defaults[key]:
                    setattr(self, key, value)
        super().__post_init__()

    def decode_config(self) -> DecodeConfig:
        """The :class:`DecodeConfig` these keys make (the preset applied)."""
        return DecodeConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(DecodeConfig)})


#: the old flat keys of ``generate`` and ``serve``'s decoding, now in their ``decode:`` section
DECODE_RENAMED: dict[str, str] = {name: f"decode.{name}" for name in (
    *DecodeConfig.__dataclass_fields__, "preset")}
#: the old keys of the model both commands load, now in their ``model:`` section
MODEL_RENAMED: dict[str, str] = {"model_dir": "model.path", "device": "model.device", "dtype": "model.dtype"}


@dataclass
class GenerateConfig(Checked):
    """``dllm-rl generate [MODEL_DIR | CONFIG.yaml] [key=value ...] [--key value ...]``: decode completions of the
    prompts (``--prompt``, ``--prompts-file``) with the ``model:`` checkpoint under the ``decode:`` settings."""

    #: the flags of earlier releases (``--gen-length``, ``--device``, ``--preset`` ...) -> their keys now
    RENAMED: ClassVar[dict[str, str]] = {**MODEL_RENAMED, **DECODE_RENAMED}

    model: ModelSection = field(default_factory=ModelSection, help="the checkpoint that decodes")
    decode: PresetDecodeConfig = field(default_factory=PresetDecodeConfig, help="how masks become tokens")
    prompt: list[str] = field(default_factory=list, help="prompt text (a repeatable flag)")
    prompts_file: str | None = field(None, help="a JSONL file, one {\"prompt\": TEXT} (or a JSON string) per line")
    image: list[str] = field(
        default_factory=list, help="image files for the prompts' <image> placeholders, in order (a repeatable flag; "
        "one prompt without a placeholder gets the images at its start); llada_v and mmada models, read as the image "
        "tasks read theirs")
    trace: str | None = field(None, help="write one JSON object per prompt (tokens, steps, confidence, nfe) to this "
                              "JSONL file")
    batch_size: int = field(32, ge=1, help="prompts decoded together")
    slots: int | None = field(
        None, ge=1, help="decode with the continuous-batching engine, N sequences at a time, a finished one replaced "
        "at once by the next prompt (same tokens as fixed batches; batch_size is then unused). Default: fixed batches")
    chat: bool = field(False, help="wrap each prompt in the tokenizer's chat template")
    chat_template: str | None = field(
        None, help="a Jinja chat template file for chat (a model whose tokenizer has none, or another)")
    progress: bool = field(False, help="print progress per batch")
    decoding: str = field("config", choices=DECODINGS, help=DECODING_HELP)
