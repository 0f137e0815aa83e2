"""The one vocabulary of the keys every command shares: where a model runs, in which dtype, with which tokenizer.

Every command's ``model:`` section declares these keys with the fields below, so ``model.device``, ``model.dtype``
and ``model.tokenizer`` take the same values, with the same default and help, in ``rl``, ``sft``, ``dpo``,
``eval``, ``generate``, ``serve``, ``pairs`` and ``trace`` (and a reward model's or judge's own section). The
run's keys (output directory, seed, resume) are :class:`~dllm_rl.training.run_config.RunConfig`'s. A batch of
sequences decoded together is ``batch_size``; the samples of one forward/backward pass are ``micro_batch_size``.

Defaults may differ where the job does: a trainer keeps float32 weights (mixed precision computes in bfloat16), a
command that only decodes defaults to ``auto``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dllm_rl.config.fields import Checked, field

#: the values of every ``dtype`` key: ``auto`` is bfloat16 on CUDA and float32 elsewhere
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: the short dtype names of earlier releases, read as the full ones with a deprecation (dllm_rl.config.renames)
OLD_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DEVICE_HELP = ("auto (CUDA when available, else the CPU) | cpu | cuda | cuda:N; a device this machine lacks is "
               "refused; under accelerate launch each process takes its own")
TOKENIZER_HELP = "tokenizer directory or hub id (null: the checkpoint's own)"


def device_field(default: str = "auto", *, what: str = "the model") -> Any:
    """A ``device`` key: where ``what`` runs (resolved by :func:`dllm_rl.models.devices.resolve_device`)."""
    return field(default, help=f"where {what} runs: {DEVICE_HELP}")


def dtype_field(default: str = "auto", *, what: str = "the model's weights", note: str = "") -> Any:
    """A ``dtype`` key, one of :data:`DTYPES`."""
    return field(default, choices=DTYPES, renamed_values=OLD_DTYPE_NAMES,
                 help=f"dtype of {what}: auto (bfloat16 on CUDA, float32 elsewhere) | float32 | bfloat16 | "
                 f"float16{note}")


def tokenizer_field(help: str = TOKENIZER_HELP, *, renamed_values: dict[str, Any] | None = None) -> Any:
    """A ``tokenizer`` key: ``None`` is the checkpoint's own (``renamed_values``: old words read as new values)."""
    return field(None, help=help, renamed_values=renamed_values)


@dataclass
class ModelSection(Checked):
    """The ``model:`` section of a command that loads a checkpoint (eval, generate, serve, pairs, trace, info); the
    trainers' sections extend it (and keep float32 weights by default)."""

    path: str = field("", help="checkpoint directory in a published layout (config.json + safetensors), or a hub "
                      "id org/name[@revision]")
    tokenizer: str | None = tokenizer_field()
    dtype: str = dtype_field()
    device: str = device_field()


__all__ = ["ModelSection", "DEVICE_HELP", "DTYPES", "OLD_DTYPE_NAMES", "TOKENIZER_HELP", "device_field", "dtype_field",
           "tokenizer_field"]
