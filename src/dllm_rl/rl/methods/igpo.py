"""IGPO: inpainting-guided policy optimization (Zhao et al. 2025, arXiv 2509.10396; facts from
facebookresearch/igpo).

When every rollout of a prompt's group fails (no GRPO signal), IGPO decodes the group again with chunks
of the reference solution inpainted (committed before decoding) into the completion, and replaces up to
``max_replacements`` of the failed rollouts by inpainted ones that succeed, so the group has a signal
again. Released settings (``run_igpo.sh``): per rollout an inpainting ratio ``~ U(0.2, 0.6)`` (sorted
within the group), chunks of 5-10 tokens, at most 4 replacements, on GRPO with d1's masking, GSPO's
sequence ratio, ``beta = 0.01``, ``lr = 5e-7``, ``train.num_iterations = 4``, temperature 1.2.
The paper's equation numbers could not be checked here.

Deviations: the reference inpainted is the task's reference completion unless ``column`` names a data
column (the released code inpaints the data's worked solution; ``configs/llada-igpo-math.yaml`` sets
``column: solution``); the reference tokens keep their own offsets in the completion (the released code
spaces chunks over the generation window).

The entropy filter (``inpaint_entropy_keep: 0.2``, :mod:`dllm_rl.rl.inpaint_filter`; the released
``entropy_clipping_ratio_inpaint``): of each sample's inpainted tokens only the ``max(1, floor(0.2 n))`` with the
highest full-vocabulary entropy under the update's masks (the old policy, d1's fully masked completion) train; the
others leave the loss mask only, generated tokens always train. As the released code: per sample, ``torch.topk``,
computed once per step before the update. Deviations: the entropy is ``-sum p log p`` (the code adds 1e-8 inside
the log); the masks are the step's (the code draws one per inner iteration, which with d1's masking are the same
for the completion); under the GSPO ratio the filtered tokens leave the ratio too (``exp(mean over trained tokens
of the log-ratio)``; the code's GSPO ratio averages over every completion position, filtered ones included, and
the filter only changes each sample's weight - its trained-token count - and the token KL), and a sample's term
is not weighted by its trained-token count (the sequence loss takes the mean over samples).
"""

from __future__ import annotations

import random

from dllm_rl.rl.hooks import HookContext, RolloutHook, RoundView, register_hook, replace_samples
from dllm_rl.rl.method import Method, Preset


def inpaint_positions(n_tokens: int, ratio: float, min_chunk: int, max_chunk: int, rng: random.Random) -> list[int]:
    """Offsets ``< n_tokens`` to inpaint: the reference cut into chunks of ``min_chunk..max_chunk`` tokens,
    chunks taken in random order until at least ``ratio * n_tokens`` offsets are covered."""
    chunks, start = [], 0
    while start < n_tokens:
        size = rng.randint(min_chunk, max_chunk)
        chunks.append(range(start, min(start + size, n_tokens)))
        start += size
    rng.shuffle(chunks)
    chosen: list[int] = []
    for chunk in chunks:
        if len(chosen) >= ratio * n_tokens:
            break
        chosen.extend(chunk)
    return sorted(chosen)


@register_hook("igpo")
def igpo_hook(
    *, column: str | None = None, max_replacements: int = 4, ratio_low: float = 0.2, ratio_high: float = 0.6,
    min_chunk: int = 5, max_chunk: int = 10, success: float = 1.0, seed: int = 0,
) -> RolloutHook:
    """IGPO's inpainting (arXiv 2509.10396, method section): for each group whose rewards are all below
    ``success``, decode it again with part of the reference solution inpainted and replace up to
    ``max_replacements`` failed rollouts by inpainted ones reaching ``success``. The reference (tokenized,
    ending with EOS) is by default the task's reference completion: the task's own answer format, which
    scores 1.0 (Countdown's ``<answer>expr</answer>``). ``column`` names a dataset column to inpaint instead,
    for data whose column holds a completion in the prompt's answer format (a worked solution ending in
    ``\\boxed{}``, as the paper's math data); a raw column such as Countdown's bare ``solution`` expression
    would never score. ``stats``: ``igpo_groups`` (all-fail groups inpainted), ``igpo_replaced``."""
    if not 0.0 <= ratio_low <= ratio_high <= 1.0:
        raise ValueError(f"igpo: need 0 <= ratio_low <= ratio_high <= 1, got {ratio_low} and {ratio_high}")
    if not 1 <= min_chunk <= max_chunk or max_replacements < 0:
        raise ValueError("igpo: need 1 <= min_chunk <= max_chunk and max_replacements >= 0")

    def reference_tokens(view: RoundView, ctx: HookContext, i: int) -> list[int] | None:
        values = view.columns.get(column) if column else None
        text = values[i] if values is not None else ctx.reference(i)
        if text is None:
            return None
        ids = list(ctx.tokenizer.encode(str(text), add_special_tokens=False)) + [ctx.eos_token_id]
        return ids[: ctx.gen_length]

    def hook(view: RoundView, ctx: HookContext) -> RoundView:
        g_n = view.group_size
        rng = random.Random(seed * 1_000_003 + ctx.step)
        stats = {"igpo_groups": 0.0, "igpo_replaced": 0.0}
        for g0 in range(0, len(view.rewards), g_n):
            members = list(range(g0, g0 + g_n))
            if any(view.rewards[i] >= success for i in members):
                continue
            ref = reference_tokens(view, ctx, g0)
            if not ref:
                continue
            ratios = sorted(rng.uniform(ratio_low, ratio_high) for _ in members)
            prefill = [{k: ref[k] for k in inpaint_positions(len(ref), r, min_chunk, max_chunk, rng)}
                       for r in ratios]
            redo = ctx.generate(members, prefill)
            rewards, reasons = ctx.reward(members, redo)
            good = [k for k, r in enumerate(rewards) if r >= success][:max_replacements]
            stats["igpo_groups"] += 1
            if good:
                view = replace_samples(view, members[: len(good)], redo.select(good),
                                       [rewards[k] for k in good], [reasons[k] for k in good])
                stats["igpo_replaced"] += len(good)
        for k, v in stats.items():
            view.stats[k] = view.stats.get(k, 0.0) + v
        return view

    return RolloutHook(hook)


METHOD = Method(
    name="igpo", paper="IGPO, arXiv 2509.10396", recipe="llada-igpo-math.yaml",
    preset=Preset(estimator="mean_field", estimator_options={"p_mask_prompt": 0.15}, loss_type="sequence",
                loss_aggregation="seq_mean", beta=0.01, kl_estimator="k3", advantage="group_zscore",
                scale_rewards="group", estimator_noise="sample", rollout_hook="igpo",
                rollout_hook_options={"max_replacements": 4, "ratio_low": 0.2, "ratio_high": 0.6,
                                      "min_chunk": 5, "max_chunk": 10},
                inpaint_entropy_keep=0.2),
    notes={"loss": "GSPO ratio",
           "hook": "inpaints the task's reference completion, or a `column` of the data, into all-fail groups"},
)
