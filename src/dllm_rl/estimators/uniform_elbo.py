"""``uniform_elbo``: the continuous-time ELBO of uniform-state diffusion (UDLM, arXiv 2412.10193; Duo, arXiv
2506.10892) as a sequence log-likelihood lower bound for uniform-state families (DiffusionGemma), canvas by canvas.

What DiffusionGemma was trained with: the published SFT recipes (NVIDIA NeMo AutoModel's guide "Fine-Tuning
DiffusionGemma" and Megatron-Bridge's DiffusionGemma loss module, a port of the reference ``sft_model.py``
objectives) corrupt each supervised canvas position with probability ``t`` to a uniform random id under the
schedule ``alpha_t = 1 - t`` and train a time-weighted cross-entropy (``base-sft``: weight 1, their default;
``reweighted-ce``: ``-alpha'/alpha``). Neither is a likelihood bound, so this estimator is the exact ELBO of that
forward process, written out below; the SFT objective is the published one (:mod:`dllm_rl.estimators.uniform_denoise`).

**Forward process** (per token, independent over positions; ``V`` the vocabulary, ``x`` the one-hot clean token):

    q(z_t | x) = Cat(alpha_t x + (1 - alpha_t) / V),   alpha_t = 1 - t,  t in [0, 1]

i.e. with probability ``t`` a position takes a uniform id (possibly its own). ``alpha_0 = 1`` (clean) and
``alpha_1 = 0`` (the uniform prior the sampler starts from, so the prior term vanishes). As a continuous-time
Markov chain, each token jumps to a uniform id at rate ``beta_t = -alpha'_t / alpha_t = 1 / (1 - t)``: the rate from
``j`` to ``i != j`` is ``beta_t / V``.

**Reverse process.** Write ``xbar = V alpha_t x + (1 - alpha_t)`` (``V`` times the marginal ``q_t(. | x)``). The true
reverse rate from ``z_t = i`` to ``j != i`` is the forward rate times the marginal ratio, ``(beta_t / V) xbar_j /
xbar_i``. The model's reverse rate replaces ``x`` by the denoiser's prediction ``p = x_theta(z_t)`` (UDLM's
parameterisation ``p_theta(z_s | z_t) = q(z_s | z_t, x = x_theta)``, whose continuous limit this is):
``(beta_t / V) xbar^theta_j / xbar^theta_i`` with ``xbar^theta = V alpha_t p + (1 - alpha_t)``.

**NELBO.** The KL between the two reverse path measures (Campbell et al. 2022, continuous-time discrete diffusion)
gives ``-log p_theta(x) <= int_0^1 E_{z_t ~ q_t} sum_l g_l dt`` with, per position (``i = z_t^l``):

    g = sum_{j != i} [ R^theta_{ij} - R_{ij} + R_{ij} log(R_{ij} / R^theta_{ij}) ]
      = (beta_t / V) [ V / xbar^theta_i - V / xbar_i
                       + ( S - S^theta + V log(xbar^theta_i / xbar_i) ) / xbar_i ]

where ``S = sum_j xbar_j log xbar_j`` and ``S^theta = sum_j xbar_j log xbar^theta_j`` (the sums over ``j != i`` of
the KL term collapse to these full sums, using ``sum_j xbar_j = sum_j xbar^theta_j = V``). This is UDLM's
Eq. (diffusion loss) rearranged; ``g >= 0``, ``g = 0`` when ``p`` is the clean one-hot, and at ``t -> 0`` it
tends to ``(1/V)(1/p_x - 1)``. ``S^theta`` is the one sum over the vocabulary besides the softmax:
``(1 - alpha_t) sum_j log(xbar^theta_j) + V alpha_t log(xbar^theta_x)``, computed as ``log1p`` terms a chunk of
positions at a time (:func:`~dllm_rl.estimators.canvases.chunked`), so no ``[B, C, V]`` tensor outlives a chunk.

**Schedule** ``alpha_t = 1 - t``: the published recipes' (rectified-flow) schedule. DiffusionGemma's denoiser takes
no time input, so the bound depends on the schedule; this is the one the model was trained under.

**Estimator.** The sequence bound is the sum over canvases of each canvas's bound given the clean canvases before
it (block diffusion). Per draw ``d`` (``num_mc`` draws), sample and canvas, ``t`` is stratified across the draws
(``t_d = (d + U_d) / D``, as ``elbo`` stratifies ``n``), every counted position of the canvas is corrupted
independently (uniform ids from the caller's generator), and each counted token gets the term ``-g`` with weight 1:
``TokenScores.sequence_score()`` (mean over draws of the weighted sum) is then an unbiased Monte-Carlo estimate of
the ELBO, ``<= log p_theta(completion | prompt)``. All randomness is drawn up front from the caller's generator
(per sample with ``sample_seeds``), so old, reference and current policy see the same ``t`` and ``z_t``.

**Self-conditioning: off.** The bound scores the single-pass denoiser ``x_theta(z_t)`` with a zero
self-conditioning input, as the first step of every canvas runs it and as training runs it on the examples without
self-conditioning. A two-pass estimate would make ``x_theta`` depend on the model's own previous guess and the
bound above no longer be that of one reverse process. The denoiser is ``softmax`` of the raw (soft-capped) logits:
the sampler's temperature is a decoding choice, not part of the model.

Cost: ``num_mc`` decoder calls per canvas (plus one encoder pass over prompt and completion).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import ScoringBatch, TokenScores
from dllm_rl.estimators.canvases import ModelCanvases, chunked, corrupt, draw_levels
from dllm_rl.estimators.checks import check_int
from dllm_rl.estimators.registry import register_uniform
from dllm_rl.estimators.rows import RowRandom
from dllm_rl.models.logprobs import DEFAULT_CHUNK_SIZE, check_chunk_size


def nelbo_integrand(logits: torch.Tensor, target: torch.Tensor, noisy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``g`` of the module docstring, float32 ``[N]``: the continuous-time NELBO integrand of uniform-state diffusion
    (UDLM arXiv 2412.10193, diffusion loss; schedule ``alpha_t = 1 - t``) at positions with denoiser logits ``[N, V]``,
    clean ids ``target`` ``[N]``, noisy ids ``noisy`` ``[N]`` and levels ``t`` ``[N]`` (in ``[0, 1)``)."""
    vocab = logits.shape[-1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    a = (1.0 - t.double()).to(logits.device)
    b, ka = 1.0 - a, vocab * a
    p_i = logp.gather(-1, noisy[:, None]).squeeze(-1).double().exp()
    p_x = logp.gather(-1, target[:, None]).squeeze(-1).double().exp()
    same = (noisy == target).double()
    x_i = b + ka * same  # xbar_i
    xt_i, xt_x = b + ka * p_i, b + ka * p_x  # xbar^theta at the noisy and the clean id
    # (1 - alpha) sum_j log(xbar^theta_j) = V xlogy(b, b) + b sum_j log1p(V alpha p_j / b); b -> 0 is the t -> 0 limit
    ratio = (ka / b.clamp(min=1e-30)).float()
    spread = b * torch.log1p(ratio[:, None] * logp.exp()).sum(-1, dtype=torch.float64)
    # S - S^theta, the V xlogy(b, b) of both sums cancelled
    s_diff = torch.xlogy(b + ka, b + ka) - torch.xlogy(b, b) - spread - ka * torch.log(xt_x)
    # V / xt_i - V / x_i and log(xt_i / x_i), written to keep precision when both are near 1 - alpha
    inverse = vocab * ka * (same - p_i) / (x_i * xt_i)
    log_ratio = torch.log1p(ka * (p_i - same) / x_i)
    beta = 1.0 / a.clamp(min=1e-30)  # -alpha' / alpha with alpha = 1 - t
    return ((beta / vocab) * (inverse + (s_diff + vocab * log_ratio) / x_i)).float()


def elbo_scores(canvases, batch: ScoringBatch, generator: torch.Generator, num_mc: int,
                chunk_size: int) -> TokenScores:
    """The module's estimator over ``canvases`` (:class:`~dllm_rl.estimators.canvases.ModelCanvases`, or any object
    with its interface: a scripted denoiser in tests). ``info``: ``t`` ``[B, D, K]`` (each canvas's level)."""
    rng = RowRandom(generator, batch)
    draws, width, vocab = num_mc, canvases.width, canvases.vocab
    levels = draw_levels(rng, draws, canvases.num)  # [B, D, K]
    keys = rng.rand(draws, canvases.num * width)  # [B, D, K*C]
    noise = rng.randint(vocab, draws, canvases.num * width)
    terms: list[list[torch.Tensor]] = [[] for _ in range(draws)]
    weights: list[torch.Tensor] = []
    forwards = 0
    for k, clean, counted in canvases:
        cols = slice(k * width, (k + 1) * width)
        rows, pos = torch.nonzero(counted, as_tuple=True)
        for d in range(draws):
            t = levels[:, d, k]
            noisy = corrupt(clean, counted, t, keys[:, d, cols], noise[:, d, cols])
            hidden = canvases.hidden(noisy)
            forwards += clean.shape[0]
            g = chunked(lambda h, y, z, tt: nelbo_integrand(canvases.head(h), y, z, tt), chunk_size,
                        hidden[rows, pos], clean[rows, pos], noisy[rows, pos], t.to(clean.device)[rows])
            terms[d].append(torch.zeros(clean.shape, device=g.device).index_put((rows, pos), -g))
        weights.append(counted.float())
    logp = torch.stack([torch.cat(parts, dim=1) for parts in terms])  # [D, B, K*C]
    weight = torch.cat(weights, dim=1).to(logp.device)[None].expand_as(logp).clone()
    g_n = batch.completion_len
    logp, weight = logp[..., :g_n], weight[..., :g_n]
    if batch.loss_mask is not None:
        weight = weight * batch.loss_mask.to(weight)
    return TokenScores(logp=logp, weight=weight, forwards=forwards, forward_tokens=forwards * width,
                       calls=canvases.num * draws, info={"t": levels.float()})


def check_uniform_elbo_options(*, num_mc: int = 2, logprob_chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
    """``uniform_elbo``'s options (``ValueError``)."""
    check_int("num_mc", num_mc, 1)
    check_chunk_size(logprob_chunk_size)


@register_uniform("uniform_elbo", counterpart="elbo", check=check_uniform_elbo_options)
def score_uniform_elbo(model, batch: ScoringBatch, generator: torch.Generator, *, num_mc: int = 2,
                       logprob_chunk_size: int = DEFAULT_CHUNK_SIZE) -> TokenScores:
    """The uniform-state ELBO (UDLM arXiv 2412.10193 / Duo arXiv 2506.10892; see the module docstring) of each
    completion given its prompt, canvas by canvas: ``num_mc`` stratified draws of ``t`` per canvas, per-token terms
    ``-g`` with weight 1, so ``sequence_score()`` is the Monte-Carlo ELBO (ESPO's sequence likelihood proxy for a
    uniform-state family). ``logprob_chunk_size``: scored positions projected onto the vocabulary at a time."""
    check_int("num_mc", num_mc, 1)
    check_chunk_size(logprob_chunk_size)
    return elbo_scores(ModelCanvases(model, batch), batch, generator, num_mc, logprob_chunk_size)
