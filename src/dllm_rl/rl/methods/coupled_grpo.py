"""coupled-GRPO (DiffuCoder, arXiv 2506.20639): a mask and its complement score every completion token once.

Token-level clipped ratio, DAPO's token mean, no KL, GRPO advantages.
"""

from dllm_rl.rl.method import Method, Preset

METHOD = Method(
    name="coupled_grpo", paper="DiffuCoder, arXiv 2506.20639", recipe="diffucoder-coupled-grpo-code.yaml",
    preset=Preset(estimator="coupled", estimator_options={}, loss_type="token", loss_aggregation="token_mean",
                beta=0.0, kl_estimator="k3", advantage="group_zscore", scale_rewards="group",
                estimator_noise="sample"),
)
