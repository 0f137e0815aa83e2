"""JustGRPO: exact likelihood in left-to-right order with plain GRPO (arXiv 2601.15165; facts from
LeapLabTHU/JustGRPO).

JustGRPO rolls a masked diffusion LM out autoregressively (block length 1: one token per step, left to
right) and trains it with GRPO on the exact likelihood of that order:
``log pi(y|x) = sum_i log p(y_i | x, y_{<i}, [MASK] * (G - i))`` - token ``i`` is read with the prompt and
the earlier tokens clean and itself and *every later token masked*, under the model's own (full)
attention. This is not the ``ar`` estimator (a causal mask over the clean sequence, right for models
adapted from AR ones): here the future is present as mask tokens, as the sampler shows it. The released
loss is the token-level clipped surrogate with ``eps = 0.2``, summed over tokens and divided by the
generation length (``loss_aggregation=fixed_length``), no KL, GRPO advantages ``(r - mean) / (std + 1e-4)``.
The paper's equation numbers could not be checked here.

Estimator ``left_to_right``: deterministic. Full attention: one row per counted token ``i`` (completion
columns ``>= i`` masked, weight 1 on ``i``); ``G`` rows per sample. Block models (two-stream layout, where
a block sees the clean earlier blocks and only its own noisy state): row ``j`` masks in-block offsets
``>= j`` of every block and scores offset ``j`` of each, which is the same left-to-right likelihood in
``block_size`` rows (:mod:`dllm_rl.estimators.left_to_right`). Deviation: the released code also scores the EOS
padding after the answer; here only counted tokens are scored (padding stays masked as the future).
"""

from dllm_rl.rl.method import Method, Preset

METHOD = Method(
    name="justgrpo", paper="JustGRPO, arXiv 2601.15165", recipe="llada-justgrpo-gsm8k.yaml",
    preset=Preset(estimator="left_to_right", estimator_options={}, loss_type="token", loss_aggregation="fixed_length",
                beta=0.0, kl_estimator="k3", advantage="group_zscore", scale_rewards="group",
                estimator_noise="sample"),
    notes={"estimator": "exact left-to-right likelihood"},
)
