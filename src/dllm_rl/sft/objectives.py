"""SFT objectives for diffusion LMs, each one small function over a :class:`ScoringBatch`.

Every objective returns :class:`~dllm_rl.estimators.base.TokenScores` (per-token float32 log-probs and
weights, ``[D, B, G]``) and is reduced by the one rule of :func:`sequence_loss`:

    loss = mean_b  mean_d  ( - sum_g weight[d,b,g] * logp[d,b,g] ) / L_b,      L_b = response length of b

(LLaDA's SFT normalisation, arXiv 2502.09992 Eq. 5 and its released code: the per-sequence sum divided by
the answer length, averaged over the batch). The prompt is never masked or scored.

=============  ==========================================================================================
``random_mask`` MDLM / LLaDA SFT: the ``random_mask`` estimator with ``lo=eps, hi=1, importance_weight``
``block``       block diffusion SFT. Block models: one noise level per block, every block trained in one
                two-stream forward (SDAR / BD3-LM). Full attention: the sliced form (one random block)
``trace``       TraceRL's trajectory replay: the ``trace`` estimator over recorded step maps
``ar``          next-token cross-entropy under a causal mask, read through the family's logit shift
=============  ==========================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from dllm_rl.config import Checked, field
from dllm_rl.estimators.base import MaskedRows, RowRandom, ScoringBatch, TokenScores, build_rows, score_rows
from dllm_rl.models import DiffusionLM, block_causal_bias, block_index, position_ids_from_valid


@dataclass
class ObjectiveConfig(Checked):
    """Which SFT loss, and its knobs."""

    name: Literal["random_mask", "block", "trace", "ar"] = field(
        "random_mask", help="random_mask (MDLM/LLaDA), block (block diffusion / semi-AR), trace (TraceRL "
        "trajectory replay, needs step maps), ar (next-token loss for AR-adapted full-attention models)")
    eps: float = field(
        1e-3, gt=0, lt=1, help="noise levels t ~ U(eps, 1) (MDLM/LLaDA eps; keeps the 1/t weight bounded)")
    num_mc: int = field(1, ge=1, help="random_mask: masked draws per sequence (Monte-Carlo samples of t)")
    block_size: int | None = field(
        None, ge=1, help="block objective: block length. Block models: null = the model's block_size (must match). "
        "Full-attention models: the semi-AR decoding block_length (required)")
    shrinkage: int = field(1, ge=1, help="trace objective: TraceRL shrinkage s (merge every s decoding steps)")
    max_rows: int | None = field(None, ge=1, help="forward at most this many masked rows at once (memory bound)")

    def options(self) -> dict[str, Any]:
        """The keyword options :func:`compute_objective` passes to this objective."""
        if self.name == "random_mask":
            return {"eps": self.eps, "num_mc": self.num_mc, "max_rows": self.max_rows}
        if self.name == "block":
            return {"eps": self.eps, "block_size": self.block_size, "max_rows": self.max_rows}
        if self.name == "trace":
            return {"shrinkage": self.shrinkage, "max_rows": self.max_rows}
        return {}


def sequence_loss(scores: TokenScores, lengths: torch.Tensor) -> torch.Tensor:
    """Scalar float32 loss ``mean_b mean_d (-sum_g w*logp) / L_b`` (LLaDA Eq. 5 normalisation)."""
    per_seq = -(scores.weight * scores.logp).sum(-1).mean(0)  # [B]
    return (per_seq / lengths.to(per_seq.device).clamp(min=1).float()).mean()


# -------------------------------------------------------------------------------------- random_mask
def random_mask_scores(
    model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator, *, eps: float = 1e-3, num_mc: int = 1,
    mask_ratio: float | None = None, max_rows: int | None = None,
) -> TokenScores:
    """MDLM / LLaDA SFT (Sahoo et al. 2024; LLaDA arXiv 2502.09992 Eq. 5):
    ``-E_{t~U(eps,1)} [ (1/t) sum_{i masked} log p(y_i | prompt, y_t) ] / L``, each response token masked
    with probability ``t``, the prompt never. Dream's shift is undone by the model adapter, so position i
    is always scored by ``logits[:, i]``. ``mask_ratio`` pins ``t`` (tests)."""
    from dllm_rl.estimators import estimate

    return estimate("random_mask", model, batch, generator, lo=eps, hi=1.0, importance_weight=True,
                    num_mc=num_mc, mask_ratio=mask_ratio, max_rows=max_rows)


# -------------------------------------------------------------------------------------- block
def plan_block(
    model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator, *, eps: float = 1e-3,
    block_size: int | None = None, mask_ratio: float | None = None,
) -> MaskedRows:
    """The masked rows of :func:`block_scores` (all randomness drawn here, from ``generator`` only).

    Block models (two-stream): blocks are ``position // block_size`` (:func:`block_index`); every block
    ``k`` holding response tokens draws ``t_k ~ U(eps, 1)``, masks each of its response tokens with
    probability ``t_k`` and weights the masked ones ``1/t_k``; the row carries ``clean_ids`` so it is run
    in the ``[prompt | clean | noisy]`` layout. Full attention (sliced): blocks count from the response
    start (semi-AR decoding blocks); one block ``k`` of the ``n_b`` response blocks is drawn uniformly,
    earlier blocks stay clean, block ``k`` is masked with probability ``t`` and later blocks fully; masked
    tokens of block ``k`` get weight ``n_b / t`` — an unbiased estimate of the same sum over blocks.
    ``info``: ``mask_ratio`` (``[B, n_blocks]`` or ``[B, 1]``), ``block`` (sliced form: ``[B]``).
    """
    rng = RowRandom(generator, batch)
    b_n, g_n, p = batch.batch_size, batch.completion_len, batch.prompt_len
    counted = batch.completion_mask
    dev = counted.device
    sample = torch.arange(b_n, device=dev)
    draw = torch.zeros(b_n, dtype=torch.long, device=dev)
    if model.is_block_causal:
        bs = int(model.block_size)
        if block_size is not None and block_size != bs:
            raise ValueError(f"objective.block_size={block_size} but the model's block_size is {bs}; leave it null")
        valid = batch.valid()
        comp_blk = block_index(position_ids_from_valid(valid), bs)[:, p:]
        n_blk = int(comp_blk.max().item()) + 1 if g_n else 1
        u = rng.rand(n_blk).to(dev)
        t_blk = torch.full_like(u, float(mask_ratio)) if mask_ratio is not None else eps + (1.0 - eps) * u
        t_tok = t_blk.gather(1, comp_blk.clamp(min=0, max=n_blk - 1))
        masked = (rng.rand(g_n).to(dev) < t_tok) & counted
        weight = masked / t_tok
        return build_rows(batch, sample, draw, masked, weight, model.mask_token_id, 1, info={"mask_ratio": t_blk},
                          two_stream=True)
    if block_size is None:
        raise ValueError("the block objective on a full-attention model needs objective.block_size "
                         "(the semi-autoregressive decoding block_length)")
    comp_blk = torch.arange(g_n, device=dev)[None, :].expand(b_n, -1) // block_size
    lengths = counted.sum(-1)
    n_blocks = torch.div(lengths + block_size - 1, block_size, rounding_mode="floor").clamp(min=1)
    u = rng.rand(2).to(dev)
    k = (u[:, 0] * n_blocks).floor().long().clamp(max=n_blocks - 1)
    t = torch.full_like(u[:, 1], float(mask_ratio)) if mask_ratio is not None else eps + (1.0 - eps) * u[:, 1]
    r = rng.rand(g_n).to(dev)
    current = (comp_blk == k[:, None]) & (r < t[:, None]) & counted
    comp_valid = batch.valid()[:, p:]
    later = (comp_blk > k[:, None]) & comp_valid
    weight = current * (n_blocks.float() / t)[:, None]
    return build_rows(batch, sample, draw, current | later, weight, model.mask_token_id, 1,
                      info={"mask_ratio": t[:, None], "block": k})


def block_scores(
    model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator, *, eps: float = 1e-3,
    block_size: int | None = None, mask_ratio: float | None = None, max_rows: int | None = None,
) -> TokenScores:
    """Block diffusion SFT (BD3-LM, Arriola et al. 2025, Eq. 8 NELBO summed over blocks; SDAR's training
    layout): ``-sum_k E_{t_k} [ (1/t_k) sum_{i in block k masked} log p(y_i | prompt, y_{<k}, y_k^{t_k}) ] / L``.
    Block models score all blocks in one forward of the two-stream layout (noisy block k sees the prompt,
    the clean blocks < k and itself); full-attention models use the sliced form of :func:`plan_block`."""
    rows = plan_block(model, batch, generator, eps=eps, block_size=block_size, mask_ratio=mask_ratio)
    return score_rows(model, rows, max_rows)


# -------------------------------------------------------------------------------------- trace
def trace_scores(
    model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator, *, shrinkage: int = 1,
    max_rows: int | None = None,
) -> TokenScores:
    """TraceRL trajectory SFT (arXiv 2509.06949, Eq. 4 with unit advantages): every response token is scored
    in the masked state just before the (merged, shrinkage ``s``) decoding step that committed it, as
    recorded in ``batch.step_map`` — training on the states the model visits at inference."""
    from dllm_rl.estimators import estimate

    if batch.step_map is None:
        raise ValueError("the trace objective needs step maps (a data column from `dllm-rl generate --trace`)")
    return estimate("trace", model, batch, generator, shrinkage=shrinkage, max_rows=max_rows)


# -------------------------------------------------------------------------------------- ar
def ar_scores(model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator | None = None) -> TokenScores:
    """Autoregressive next-token loss ``-sum_i log p(y_i | prompt, y_{<i}) / L`` under a causal mask, for
    full-attention models adapted from AR models (Dream / DiffuCoder from Qwen2.5, Gong et al. 2025).

    The token at column ``c`` is predicted by the raw logits at ``c-1``: for a shifted family (Dream)
    that is the adapter's aligned ``logits[:, c]``, otherwise ``logits[:, c-1]``. A response token whose
    previous column is padding (empty prompt) is not scored."""
    ids, valid = batch.input_ids(), batch.valid()
    device = model.device
    ids, valid = ids.to(device), valid.to(device)
    pos = position_ids_from_valid(valid)
    bias = block_causal_bias(valid, 1, pos, dtype=model.dtype)  # block size 1 = causal
    out = model(input_ids=ids, position_ids=pos, attn_bias=bias)
    p, g = batch.prompt_len, batch.completion_len
    cols = torch.arange(p, p + g, device=device)
    src = cols if model.family.shift else cols - 1
    scored = batch.completion_mask.to(device) & (valid[:, (cols - 1).clamp(min=0)] & (cols >= 1))
    logits = out.logits[:, src.clamp(min=0)].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, batch.completion_ids.to(device)[..., None]).squeeze(-1)
    weight = scored.float()
    logp = torch.where(scored, logp, torch.zeros_like(logp))
    return TokenScores(logp=logp[None], weight=weight[None], forwards=ids.shape[0], forward_tokens=int(ids.numel()),
                       calls=1)


# -------------------------------------------------------------------------------------- registry
OBJECTIVES: dict[str, Callable[..., TokenScores]] = {
    "random_mask": random_mask_scores,
    "block": block_scores,
    "trace": trace_scores,
    "ar": ar_scores,
}


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor
    scores: TokenScores
    scored_tokens: int


def compute_objective(
    name: str, model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator, **options: Any
) -> ObjectiveOutput:
    """Run objective ``name`` and reduce it with :func:`sequence_loss`."""
    fn = OBJECTIVES.get(name)
    if fn is None:
        raise ValueError(f"unknown SFT objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
    if name == "ar" and model.is_block_causal:
        raise ValueError("the ar objective is for full-attention models (block models train with block/trace)")
    scores = fn(model, batch, generator, **options)
    loss = sequence_loss(scores, batch.lengths)
    if torch.is_grad_enabled() and not loss.requires_grad:
        # Nothing was masked in this micro-batch (small t, short responses), so no row was forwarded. Run the
        # clean batch once with a zero weight: backward stays legal and DDP ranks stay in step.
        out = model(input_ids=batch.input_ids().to(model.device), attention_mask=batch.valid().to(model.device))
        loss = loss + 0.0 * out.logits.float().mean()
    return ObjectiveOutput(loss=loss, scores=scores, scored_tokens=int(scores.scored().sum().item()))
