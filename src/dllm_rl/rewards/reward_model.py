"""A sequence-classification reward model as a reward: the layout of the common open reward models
(``AutoModelForSequenceClassification`` with one label, a tokenizer with a chat template), scored in batches.

The model reads ``[user: prompt, assistant: completion]`` through its own chat template (reward models are
trained on chat-formatted pairs, so the policy's raw text would be read out of distribution) and gives one
logit per pair. :class:`RewardModel` is a TRL-signature reward ``(prompts, completions, **columns) -> list
of floats``. Optional normalisation divides by a running standard deviation after subtracting the running mean
(the moments of every score seen, updated with the batch before it is normalised); its state goes into
checkpoints (:meth:`RewardModel.state_dict`) so that a resumed run normalises exactly as the run it continues.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dllm_rl.config import Checked, field
from dllm_rl.config.vocabulary import device_field, dtype_field
from dllm_rl.errors import UserError
from dllm_rl.models.devices import resolve_device, resolve_eval_dtype
from dllm_rl.tasks.base import completion_text

logger = logging.getLogger(__name__)


@dataclass
class RewardModelConfig(Checked):
    """The ``reward:`` section: a sequence-classification reward model and how it is run."""

    model: str = field("", help="the reward model: ORG/NAME on the Hugging Face hub or a local folder holding an "
                                "AutoModelForSequenceClassification checkpoint with num_labels=1 (the layout of "
                                "the common open reward models) and a tokenizer with a chat template")
    batch_size: int = field(8, ge=1, help="(prompt, completion) pairs per forward of the reward model")
    device: str = device_field(what="the reward model")
    dtype: str = dtype_field(what="the reward model's weights")
    max_length: int = field(4096, ge=1, help="tokens of a chat-formatted pair scored; longer pairs are cut at "
                                             "this length (their end is dropped)")
    prompt_column: str | None = field(
        None, help="a data column whose value is the user turn (text) or the conversation (a list of turns) the "
        "reward model reads before the completion (e.g. the raw question); default: the data's messages column "
        "when it has one (the chat task's), else the policy's prompt text")
    normalize: bool = field(False, help="subtract the running mean and divide by the running std of every score "
                                        "seen so far (state saved with checkpoints for an exact resume)")
    clip: float | None = field(None, gt=0, help="clip scores to [-clip, clip] (after normalisation); null: no clip")


class RunningMoments:
    """Count, mean and sum of squared deviations of every value seen, merged batch by batch (Chan, Golub and
    LeVeque 1979, the pairwise update of the mean and M2), in float64."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, values: Sequence[float]) -> None:
        n = len(values)
        if n == 0:
            return
        b_mean = math.fsum(values) / n
        b_m2 = math.fsum((v - b_mean) ** 2 for v in values)
        total = self.count + n
        delta = b_mean - self.mean
        self.mean += delta * n / total
        self.m2 += b_m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        """The population standard deviation (0 before two values)."""
        return math.sqrt(self.m2 / self.count) if self.count > 1 else 0.0

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


def _load_error(key: str, source: str, exc: BaseException) -> UserError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return UserError(f"{key}: cannot load {source!r} ({type(exc).__name__}: {first[:200]}); give a local folder "
                     "or ORG/NAME of a model that transformers can load")


def load_reward_model(cfg: RewardModelConfig, key: str = "reward.model") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``cfg.model``, in eval mode on its device and dtype. A checkpoint that is not a
    one-label sequence classifier, whose head weights are missing (transformers would start them at random), or
    whose tokenizer has no chat template is refused with a :class:`UserError` naming ``key``."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    if not cfg.model:
        raise UserError(f"{key}: not set; give ORG/NAME or a folder of a sequence-classification reward model")
    try:
        conf = AutoConfig.from_pretrained(cfg.model)
    except (OSError, ValueError, KeyError) as exc:
        raise _load_error(key, cfg.model, exc) from None
    archs = list(getattr(conf, "architectures", None) or [])
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise UserError(f"{key}: {cfg.model!r} has no classification head (architectures: {', '.join(archs) or 'none'}"
                        "); give a reward model saved as *ForSequenceClassification with num_labels=1")
    if conf.num_labels != 1:
        raise UserError(f"{key}: {cfg.model!r} has {conf.num_labels} labels; a reward model gives one score "
                        "(num_labels=1)")
    device = resolve_device(cfg.device, "reward.device")
    dtype = getattr(torch, resolve_eval_dtype(cfg.dtype, device))
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(cfg.model, dtype=dtype,
                                                                         output_loading_info=True)
        tok = AutoTokenizer.from_pretrained(cfg.model)
    except (OSError, ValueError, KeyError) as exc:
        raise _load_error(key, cfg.model, exc) from None
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise UserError(f"{key}: {cfg.model!r} has no weights for {', '.join(missing[:3])}: its classification "
                        "head would be random; give a trained sequence-classification reward model")
    if not getattr(tok, "chat_template", None):
        raise UserError(f"{key}: the tokenizer of {cfg.model!r} has no chat template; a reward model reads chat-"
                        "formatted pairs, so give one whose tokenizer_config.json has a chat_template")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if model.config.pad_token_id is None:  # the head reads each row's last non-pad token
        model.config.pad_token_id = tok.pad_token_id
    tok.padding_side = "right"  # real tokens keep their positions, so padding changes no score
    return model.to(device).eval(), tok


def _user_turn(prompt: Any) -> list[dict[str, str]]:
    """The conversation before the completion: a prompt given as chat messages is kept, text becomes one turn."""
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
        return [dict(m) for m in prompt]
    return [{"role": "user", "content": completion_text(prompt)}]


class RewardModel:
    """A sequence-classification reward model as a TRL-signature reward. ``last_raw`` holds the last batch's
    scores before normalisation and clip (for logging)."""

    def __init__(self, cfg: RewardModelConfig, key: str = "reward.model", loaded: tuple[Any, Any] | None = None):
        self.cfg, self.key = cfg, key
        self.model, self.tokenizer = loaded if loaded is not None else load_reward_model(cfg, key)
        self.moments = RunningMoments()
        self.last_raw: list[float] = []
        self.__name__ = "reward_model"

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, list[Any]]) -> list[str]:
        """Each pair as the reward model reads it: its chat template over the user turn and the completion."""
        users = columns.get(self.cfg.prompt_column) if self.cfg.prompt_column else columns.get("messages", prompts)
        if users is None:
            raise UserError(f"{self.key}: prompt_column {self.cfg.prompt_column!r} is not a column of the data")
        return [self.tokenizer.apply_chat_template(
            [*_user_turn(u), {"role": "assistant", "content": completion_text(c)}], tokenize=False)
            for u, c in zip(users, completions)]

    @torch.no_grad()
    def raw_scores(self, texts: list[str]) -> list[float]:
        """The model's logit for each text, ``batch_size`` texts per forward (right-padded)."""
        out: list[float] = []
        for i in range(0, len(texts), self.cfg.batch_size):
            enc = self.tokenizer(texts[i:i + self.cfg.batch_size], add_special_tokens=False, padding=True,
                                 truncation=True, max_length=self.cfg.max_length, return_tensors="pt")
            logits = self.model(**enc.to(self.model.device)).logits
            out.extend(logits[:, 0].float().tolist())
        return out

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        raw = self.raw_scores(self.texts(prompts, completions, columns))
        self.last_raw = raw
        scores = raw
        if self.cfg.normalize:
            self.moments.update(raw)
            std = self.moments.std
            scores = [(v - self.moments.mean) / std if std > 0 else 0.0 for v in raw]
        if self.cfg.clip is not None:
            scores = [min(max(v, -self.cfg.clip), self.cfg.clip) for v in scores]
        return scores

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps for an exact resume: the normalisation's running moments."""
        return {"moments": self.moments.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments.load_state_dict(state["moments"])
