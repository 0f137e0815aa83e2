"""UniGRPO, random-masking GRPO (MMaDA, arXiv 2505.15809).

Each update masks the completion at a random ratio and scores the masked tokens; token-level clipped ratio, no KL,
GRPO advantages.
"""

from dllm_rl.rl.method import Method, Preset

METHOD = Method(
    name="random_mask_grpo", paper="MMaDA UniGRPO, arXiv 2505.15809", recipe="mmada-random-mask-grpo-math.yaml",
    preset=Preset(estimator="random_mask", estimator_options={}, loss_type="token", loss_aggregation="token_mean",
                beta=0.0, kl_estimator="k3", advantage="group_zscore", scale_rewards="group",
                estimator_noise="sample"),
)
