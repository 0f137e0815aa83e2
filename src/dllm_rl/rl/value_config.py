"""The ``value_model`` section of the RL config: TraceRL's diffusion value model (arXiv 2509.06949)."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_rl.config import Checked, ConfigError, field


@dataclass
class ValueModelConfig(Checked):
    """TraceRL's diffusion value model (see :mod:`dllm_rl.rl.value`). Off by default, as in the published TraceRL
    recipes (their value model is a separate ``*_with_value`` configuration)."""

    enabled: bool = field(
        False, help="train a value model and use its GAE token advantages instead of the group advantages "
        "(TraceRL's diffusion value model; needs loss_type=token)")
    init_from: str = field(
        "policy", help="the value backbone: policy (a copy of the start policy; with lora.enabled its base weights "
        "with the value model's own adapter) or a checkpoint directory of the same family (e.g. a smaller model)")
    lr: float | None = field(
        None, gt=0, help="the value model's AdamW learning rate (constant); default 5 x optim.lr (the published "
        "TraceRL value configs: 5e-6 for a 1e-6 policy)")
    epsilon: float = field(
        0.2, gt=0, help="clip range of the value loss around the rollout-time values (published: 0.2)")
    gamma: float = field(1.0, ge=0, le=1, help="discount over decoding steps: R_t = r_t + gamma R_{t+1} (published: 1)")
    lam: float = field(1.0, ge=0, le=1, help="GAE lambda over decoding steps (published: 1)")
    whiten: bool = field(False, help="normalise the token advantages to mean 0, std 1 over the batch's tokens")
    shrinkage: int | None = field(
        None, ge=1, help="decoding steps merged into one value step (TraceRL's s); default: the trace estimator's "
        "shrinkage when estimator=trace, else 1")
    step_chunk_size: int = field(
        8, ge=1, help="uniform-state families (DiffusionGemma): trajectory steps whose value forwards are "
        "back-propagated together (the update's memory is one chunk's; each chunk re-encodes its prompt and canvases)")
    epochs: int = field(1, ge=1, help="passes of the value update over each rollout batch")
    micro_batch_size: int | None = field(
        None, ge=1, help="samples per value forward/backward (default train.micro_batch_size)")
    max_grad_norm: float | None = field(1.0, help="clip the value model's gradient norm (null = no clipping)")


def check_value_model(cfg: ValueModelConfig, loss_type: str) -> None:
    """Raise :class:`ConfigError` when the value model is on with a loss that cannot take its advantages."""
    if cfg.enabled and loss_type != "token":
        raise ConfigError(f"value_model.enabled: the value model gives per-token advantages, which need "
                          f"loss_type=token (got {loss_type!r}); use algorithm=tracerl or loss_type=token")
