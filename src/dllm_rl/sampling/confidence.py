"""What to commit at one denoising step: token choice, confidence scores, and the commit rule.

All maths runs in float64 (LLaDA computes its Gumbel noise and softmax in float64: low-precision Gumbel-max
hurts generation quality, arXiv 2409.02908). Every random draw comes from the *row's own*
``torch.Generator`` and has a fixed shape per step (``[block, vocab]`` for token noise, ``[block]`` for
random scores), so a sequence's output does not depend on its batch neighbours or on padding.
:func:`choose_tokens` runs a step's rows a few at a time, so the float64 copies (``[rows, block, vocab]``
each) stay bounded at real vocabularies whatever the batch.
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf (Holtzman et al. 2020, nucleus sampling).

    Top-p keeps, in descending probability, every token whose preceding cumulative mass is < ``top_p``
    (the smallest set with mass >= ``top_p``, as HF's ``TopPLogitsWarper``; the most likely
    token always survives).
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(-1) - probs  # mass strictly before each token
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def gumbel_noise(generators: list[torch.Generator], shape: tuple[int, ...], device) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log u)``, ``u ~ U[0, 1)`` in float64, one ``shape`` draw per generator."""
    u = torch.stack([torch.rand(shape, generator=g, dtype=torch.float64, device=device) for g in generators])
    return -torch.log(-torch.log(u))


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generators: list[torch.Generator] | None = None,
) -> torch.Tensor:
    """Tokens ``[n, L]`` from float64 logits ``[n, L, V]``: argmax when ``temperature == 0``, else Gumbel-max.

    Gumbel-max (LLaDA ``add_gumbel_noise``): LLaDA takes ``argmax exp(l) / (-log u)^T``; taking logs and
    dividing by ``T`` gives the same argmax as ``l / T - log(-log u)``, i.e. an exact sample of
    ``softmax(l / T)`` restricted to the top-k / top-p set. Ties in argmax go to the lower token id.
    """
    if temperature == 0:
        return logits.argmax(-1)
    if generators is None or len(generators) != logits.shape[0]:
        raise ValueError("sample_tokens: sampling needs one generator per row")
    scores = filter_logits(logits / temperature, top_k, top_p)
    return (scores + gumbel_noise(generators, tuple(logits.shape[1:]), logits.device)).argmax(-1)


def confidence_scores(
    rule: str,
    logits: torch.Tensor,
    tokens: torch.Tensor,
    generators: list[torch.Generator] | None = None,
) -> torch.Tensor:
    """Per-position confidence ``[n, L]`` in [0, 1] (float64) under the model's distribution p = softmax(logits).

    * ``prob``: ``p(token)`` — LLaDA low-confidence remasking (the probability of the chosen token under the
      untempered model distribution, as LLaDA computes it).
    * ``margin``: ``p_(1) - p_(2)`` — Dream's ``topk_margin`` (top-1 minus top-2 probability).
    * ``entropy``: ``exp(-H(p))`` with ``H = -sum p log p`` — Dream's ``entropy`` rule ranks by ``-H``; the
      monotone map into (0, 1] keeps its order and makes ``threshold`` meaningful.
    * ``random``: ``u ~ U[0, 1)`` from the row's generator — LLaDA ``random`` remasking.
    """
    if rule == "random":
        if generators is None or len(generators) != logits.shape[0]:
            raise ValueError("confidence 'random' needs one generator per row")
        shape = tuple(tokens.shape[1:])
        return torch.stack([torch.rand(shape, generator=g, dtype=torch.float64, device=logits.device)
                            for g in generators])
    probs = torch.softmax(logits, dim=-1)
    if rule == "prob":
        return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if rule == "margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    if rule == "entropy":
        plogp = torch.where(probs > 0, probs * torch.log(probs), torch.zeros_like(probs))
        return torch.exp(plogp.sum(-1))
    raise ValueError(f"unknown confidence rule {rule!r}")


def entropies(logits: torch.Tensor) -> torch.Tensor:
    """``[n, L]``: the full-vocabulary Shannon entropy ``H = -sum_v p_v log p_v`` of ``p = softmax(logits)`` (the
    untempered model distribution, as the confidence rules use), as ``logsumexp(l) - sum_v p_v l_v`` (no
    ``p log p`` at ``p = 0``). EGSPO (arXiv 2603.12554) selects the denoising steps to train on by it."""
    finite = torch.isfinite(logits)
    probs = torch.softmax(logits, dim=-1)
    mean_logit = (probs * torch.where(finite, logits, torch.zeros_like(logits))).sum(-1)
    return torch.logsumexp(logits, dim=-1) - mean_logit


# float64 elements of one [rows, block, vocab] copy per chunk of rows: 2**24 (128 MiB), e.g. 3 rows of a block of
# 32 at a 152k vocabulary; the whole batch when the vocabulary is small.
STEP_ELEMENTS = 1 << 24


def choose_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    rule: str,
    generators: list[torch.Generator] | None,
    max_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens [n, L], confidence [n, L] float64, entropy [n, L] float64)`` of one step from logits ``[n, L, V]``
    (any dtype; the entropy is :func:`entropies`', recorded in ``Rollout.entropy``).

    :func:`sample_tokens`, :func:`confidence_scores` and :func:`entropies` in float64, over as many rows at a time
    as keep one float64 copy within ``max_elements`` (default :data:`STEP_ELEMENTS`; at least one row). Every row draws
    from its own generator in the same order (token noise, then random scores), so the result does not
    depend on ``max_elements``.
    """
    n, length, vocab = logits.shape
    budget = STEP_ELEMENTS if max_elements is None else max_elements
    per = max(1, budget // max(length * vocab, 1))
    tokens, conf, ent = [], [], []
    for start in range(0, n, per):
        x = logits[start : start + per].double()
        gens = generators[start : start + per] if generators is not None else None
        t = sample_tokens(x, temperature, top_k, top_p, gens)
        tokens.append(t)
        conf.append(confidence_scores(rule, x, t, gens))
        ent.append(entropies(x))
        del x
    if not tokens:
        empty = logits.new_zeros((0, length))
        return empty.long(), empty.double(), empty.double()
    return torch.cat(tokens), torch.cat(conf), torch.cat(ent)


def transfer_counts(masked: torch.Tensor, steps: int, step: int) -> torch.Tensor:
    """Tokens to commit at local ``step`` of a block that started with ``masked`` masks.

    LLaDA ``get_num_transfer_tokens`` (arXiv 2502.09992): under its linear noise schedule (Eq. 8) the expected
    number of tokens unmasked per step is constant, so each of the ``steps`` steps commits
    ``masked // steps`` tokens and the first ``masked % steps`` steps one more.
    """
    base = torch.div(masked, steps, rounding_mode="floor")
    return base + (step < masked % steps).long()


def left_after(masked: torch.Tensor, steps: int, step: int) -> torch.Tensor:
    """Masks the static schedule leaves after local ``step`` of a block that started with ``masked``:
    ``masked - sum_{k <= step} transfer_counts(masked, steps, k)`` (MDPO's RCR re-masks this many, arXiv
    2508.13148)."""
    base = torch.div(masked, steps, rounding_mode="floor")
    return masked - (step + 1) * base - (masked % steps).clamp(max=step + 1)


def rcr_remask(running: torch.Tensor, drawn: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Which slots to re-mask ``[n, L]`` (bool): MDPO's Running-Confidence Remasking (He et al. 2025, arXiv
    2508.13148; authors' ``diffusion_generate`` with ``rcr``): the ``counts[r]`` slots of row r with the lowest
    running confidence ``running`` (each token's score when it was last sampled), among the slots the sampler
    drew in this block (``drawn``), ties to the lower position. The authors rank every slot of the sequence, so
    with several blocks a finished block's tokens can be re-masked and never refilled; ranking only the
    current block's drawn slots is our guard (the same with one block, the authors' setting)."""
    return select_commits(-running, drawn, counts=counts)


def current_sub_block(candidates: torch.Tensor, size: int) -> torch.Tensor:
    """``candidates`` ``[n, L]`` (bool) kept only in each row's first sub-block of ``size`` slots (from column 0)
    that holds one: Fast-dLLM v2 (Wu et al. 2025, arXiv 2509.26328) finishes a sub-block before the next. A row
    with no candidate stays empty."""
    cols = torch.arange(candidates.shape[-1], device=candidates.device)
    first = candidates.int().argmax(-1)  # the first candidate's column (0 for an empty row, which stays empty)
    start = (first // size * size)[:, None]
    return candidates & (cols >= start) & (cols < start + size)


def select_commits(
    conf: torch.Tensor,
    candidates: torch.Tensor,
    counts: torch.Tensor | None = None,
    threshold: float | None = None,
) -> torch.Tensor:
    """Which positions to commit ``[n, L]`` (bool), highest confidence first, ties to the lower position.

    Static (``counts [n]``): the ``counts[r]`` most confident candidates of row r. Dynamic (``threshold``):
    every candidate with confidence > threshold, and at least the most confident one (Fast-dLLM / SDAR
    ``low_confidence_dynamic``). Non-candidates are never committed.
    """
    score = conf.masked_fill(~candidates, float("-inf"))
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device)
                                             .expand_as(order).contiguous())
    if threshold is not None:
        chosen = (score > threshold) | (rank == 0)
    else:
        if counts is None:
            raise ValueError("select_commits: give counts (static) or threshold (dynamic)")
        chosen = rank < counts[:, None]
    return chosen & candidates
