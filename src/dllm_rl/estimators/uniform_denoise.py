"""``uniform_denoise``: DiffusionGemma's published SFT objective, the denoising cross-entropy of uniform-state
diffusion with self-conditioning trained as the model uses it.

Read in NVIDIA NeMo AutoModel's guide "Fine-Tuning DiffusionGemma" (its ``DiffusionGemmaSFTRecipe``) and in
Megatron-Bridge's DiffusionGemma loss module (``base-sft``, a port of the reference ``sft_model.py`` objectives):

- one noise level ``t ~ U(eps, 1)`` per example (here per example and canvas, stratified across draws; ``eps``
  1e-3 as NeMo's ``dllm.eps``), schedule ``alpha_t = 1 - t``;
- every supervised canvas position is independently replaced, with probability ``t``, by a uniform random id (no
  mask token); unsupervised positions stay clean;
- the loss is the flat cross-entropy ``-log p_theta(x_l | z_t)`` over *all* supervised positions, corrupted and
  clean, with no ``1/t`` weight (``base-sft``, the recipes' default), averaged over the supervised tokens;
- self-conditioning, two-pass (Analog Bits, arXiv 2208.04202): a first pass without gradient and without
  self-conditioning gives logits; with probability ``self_conditioning_p`` (0.5) per example they are fed to the
  second pass as ``self_conditioning_logits``, otherwise ``self_conditioning_mask`` zeroes them. The first pass's
  logits are fed as they are (the sampler feeds its tempered ones: the temperature is a decoding choice).

Differences, on purpose: NeMo scores one randomly chosen canvas per example and step, we score every canvas of
the completion, each against the clean canvases before it (in expectation the same loss up to a constant factor,
with less variance); NeMo adds a causal next-token loss on the encoder (``encoder_loss_weight`` 1.0), which is not
here. The per-token terms are ``log p_theta(x_l | z_t)`` with weight 1, reduced by the SFT rule
(:func:`dllm_rl.sft.objectives.sequence_loss`: the sum over the answer divided by its length).

The first pass projects the whole canvas onto the vocabulary (``[B, C, V]``, no gradient): the stock decoder takes
self-conditioning as logits of that shape. The scored pass projects ``logprob_chunk_size`` positions at a time.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import ScoringBatch, TokenScores
from dllm_rl.estimators.canvases import ModelCanvases, corrupt, draw_levels
from dllm_rl.estimators.checks import check_int, check_unit_interval
from dllm_rl.estimators.registry import register_uniform
from dllm_rl.estimators.rows import RowRandom
from dllm_rl.models.logprobs import DEFAULT_CHUNK_SIZE, check_chunk_size, selected_logprobs


def denoise_scores(canvases, batch: ScoringBatch, generator: torch.Generator, *, num_mc: int, eps: float,
                   self_conditioning_p: float, chunk_size: int) -> TokenScores:
    """The module's objective over ``canvases`` (:class:`~dllm_rl.estimators.canvases.ModelCanvases` or its
    interface). ``info``: ``t`` ``[B, D, K]``, ``self_conditioned`` ``[B, D, K]`` (bool)."""
    rng = RowRandom(generator, batch)
    draws, width, vocab = num_mc, canvases.width, canvases.vocab
    levels = draw_levels(rng, draws, canvases.num, lo=eps)  # [B, D, K]
    keys = rng.rand(draws, canvases.num * width)
    noise = rng.randint(vocab, draws, canvases.num * width)
    conditioned = rng.rand(draws, canvases.num) < self_conditioning_p  # [B, D, K]
    terms: list[list[torch.Tensor]] = [[] for _ in range(draws)]
    weights, forwards = [], 0
    for k, clean, counted in canvases:
        cols = slice(k * width, (k + 1) * width)
        rows, pos = torch.nonzero(counted, as_tuple=True)
        for d in range(draws):
            noisy = corrupt(clean, counted, levels[:, d, k], keys[:, d, cols], noise[:, d, cols])
            flags = conditioned[:, d, k].to(clean.device)
            first = None
            if bool(flags.any()):  # the first pass: no gradient, no self-conditioning
                with torch.no_grad():
                    first = canvases.head(canvases.hidden(noisy)).to(canvases.embedding_dtype)
                forwards += clean.shape[0]
            hidden = canvases.hidden(noisy, first, flags if first is not None else None)
            forwards += clean.shape[0]
            logp = selected_logprobs(hidden[rows, pos], canvases.head, clean[rows, pos], chunk_size)
            term = torch.zeros(clean.shape, device=hidden.device).index_put((rows, pos), logp)
            if not len(rows) and torch.is_grad_enabled():  # no counted token: keep a graph so backward stays legal
                term = term + 0.0 * hidden.float().sum()
            terms[d].append(term)
        weights.append(counted.float())
    logp = torch.stack([torch.cat(parts, dim=1) for parts in terms])[..., :batch.completion_len]
    weight = torch.cat(weights, dim=1).to(logp.device)[None].expand(draws, -1, -1)[..., :batch.completion_len].clone()
    if batch.loss_mask is not None:
        weight = weight * batch.loss_mask.to(weight)
    return TokenScores(logp=logp, weight=weight, forwards=forwards, forward_tokens=forwards * width,
                       calls=forwards // max(batch.batch_size, 1),
                       info={"t": levels.float(), "self_conditioned": conditioned})


@register_uniform("uniform_denoise")
def score_uniform_denoise(model, batch: ScoringBatch, generator: torch.Generator, *, num_mc: int = 1,
                          eps: float = 1e-3, self_conditioning_p: float = 0.5,
                          logprob_chunk_size: int = DEFAULT_CHUNK_SIZE) -> TokenScores:
    """DiffusionGemma's published SFT denoising cross-entropy (NeMo AutoModel ``DiffusionGemmaSFTRecipe`` /
    Megatron-Bridge ``base-sft``; see the module docstring): per canvas ``t ~ U(eps, 1)``, uniform corruption with
    probability ``t``, two-pass self-conditioning with probability ``self_conditioning_p`` per example; per-token
    ``log p_theta(x | z_t)`` with weight 1 on every counted token. Not a likelihood bound (use ``uniform_elbo``)."""
    check_int("num_mc", num_mc, 1)
    check_chunk_size(logprob_chunk_size)
    check_unit_interval("eps", eps, open_low=True, open_high=True)
    check_unit_interval("self_conditioning_p", self_conditioning_p)
    return denoise_scores(ModelCanvases(model, batch), batch, generator, num_mc=num_mc, eps=eps,
                          self_conditioning_p=self_conditioning_p, chunk_size=logprob_chunk_size)
