"""Sampling engine: parallel masked-diffusion decoding with KV caches that records each token's step.

``generate(model, prompts, config)`` decodes a batch of token-id prompts and returns a :class:`Rollout`.

**Blocks.** Full-attention models (LLaDA, Dream) decode ``gen_length`` slots in semi-autoregressive blocks
of ``block_length`` (LLaDA). Block models (SDAR/TraDo) decode in their ``block_size`` at absolute
positions (``models.masks.block_index``): the first decoded block holds the prompt's tail
``p % block_size`` tokens, fixed, plus the first response slots, and each row is rounded up so that it ends
on a block boundary: ``gen_length + (block_size - p % block_size) % block_size`` completion tokens.

**Rollout fields.**

* ``prompt_ids``/``prompt_mask`` ``[B, P]``: prompts left-padded with the pad id.
* ``completion_ids`` ``[B, G]``: each row's completion slots, left-aligned (column 0 = the token right after
  the prompt). ``G = gen_length`` for full-attention models; for block models ``G`` is the widest row
  (at most ``gen_length + block_size - 1``) and shorter rows are right-padded with the pad id.
  ``cat([prompt_ids, completion_ids])`` with validity ``cat([prompt_mask, slot exists])`` has the
  positions the sampler used.
* ``completion_mask``: the answer — slots up to and including the first EOS.
* ``step_map`` ``[B, G]``: the **global step** at which each completion token was committed, counted per
  sequence from 0; step ``k`` is that sequence's ``k``-th forward pass (``nfe`` counts them, so
  ``step_map.max() + 1 == nfe``). Steps never commit zero tokens, and a row spends no step while waiting
  for batch neighbours. ``-1`` = never generated: right padding, and the EOS fill after an early stop
  (those slots held the mask token during decoding and lie outside ``completion_mask``).
  Replay (TraceRL): the state *just before* step ``k`` is the prompt plus every completion token with
  ``0 <= step_map < k``; all other slots (including ``-1`` ones) are the mask token. The tokens committed
  at step ``k`` are those with ``step_map == k``. Blocks are decoded in order, so the tokens of block
  ``b`` carry consecutive steps; for block models the *local* step inside a block is
  ``step_map - min(step_map over that block's generated slots)``.
* ``confidence`` ``[B, G]`` float32: the rule's score of the token at commit time (0 where ``-1``).
  With ``remasking="rcr"`` (MDPO's Running-Confidence Remasking) a committed token can be re-masked and
  re-predicted within its block: ``step_map`` / ``confidence`` are then those of its last commit.
* ``step_tokens`` / ``step_masked`` / ``step_confidence`` ``[B, S, G]`` (``generate(..., record_steps=KIND)``
  only): per step, the state before it with the step's prediction (sampled token, or the argmax) at every masked
  slot of the block, which slots were masked, and their scores (:mod:`~dllm_rl.sampling.step_record`; MDPO and
  EGSPO reward them).
* ``entropy`` ``[B, G]`` float32: the full-vocabulary entropy of the (untempered) model distribution the token was
  chosen from, at commit time (0 where ``-1``); computed with the confidence, a few rows of a step at a time.
* ``prefilled`` ``[B, G]`` bool (``None`` when nothing was): the tokens committed before decoding
  (``generate(..., prefill=)``: inpainting, IGPO's hints); they have ``step_map`` -1 too, but unlike the EOS fill
  they lie inside ``completion_mask`` and are trained on (IGPO keeps only the highest-entropy ones,
  :mod:`dllm_rl.rl.inpaint_filter`).
* ``nfe`` ``[B]``: forward passes that decoded something for that sequence (the same with and without
  cache: block models fold the cache write of a finished block into the next block's first step).
* ``finish_reason``: ``"eos"`` when the completion contains EOS (any of the model's ``eos_token_ids``; with or
  without ``stop_on_eos``: the answer ends there), else ``"length"``.
* ``texts``: the answers decoded by the tokenizer (before the first EOS, special tokens skipped).
* ``images`` (LLaDA-V, ``generate(..., images=)``): the :class:`~dllm_rl.models.prompt_images.PromptImages` whose
  features were spliced into each prompt; ``prompt_ids`` hold the pad id at those positions. Scoring the rollout
  (``ScoringBatch.from_rollout``) splices the same features, computed once.

**Uniform-state families** (DiffusionGemma, ``Family.noise == "uniform"``): ``generate`` decodes them with their
own sampler (:mod:`~dllm_rl.sampling.uniform_rollout`): ``completion_ids`` are the kept canvases (pad after EOS),
``nfe`` the stock pass count, ``step_map`` the counted step that last accepted the kept token (-1: none), no
``confidence`` / ``entropy``, and ``uniform`` the trajectory (canvas fed in, draws, accepted positions,
self-conditioning and counted rows per step, ``[B, S, G]``).

**Determinism and batch invariance.** Sequence i draws all its randomness (Gumbel noise in float64,
random confidence) from its own ``torch.Generator`` seeded with ``seeds[i]`` (default ``config.seed + i``),
with the same draw shapes whatever the batch, and padding never changes positions or blocks; so a prompt's
tokens and trace do not depend on its neighbours (up to last-ulp float differences between kernel shapes,
which can only matter at exact confidence ties).
"""

from dllm_rl.sampling.batched import generate, generate_batched
from dllm_rl.sampling.config import CACHE_MODES, CONFIDENCE_RULES, DecodeConfig
from dllm_rl.sampling.rollout import Rollout

__all__ = ["CACHE_MODES", "CONFIDENCE_RULES", "DecodeConfig", "Rollout", "generate", "generate_batched"]
