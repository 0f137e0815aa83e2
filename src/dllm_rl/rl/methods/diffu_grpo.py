"""diffu-GRPO (d1, arXiv 2504.12216): GRPO on the one-step mean-field estimate.

Each token's log-likelihood is read in one forward of the fully masked completion with the prompt's tokens masked
at random (``p_mask_prompt = 0.15``); token-level clipped ratio with GRPO's ``1/|o_i|`` mean (``seq_mean``), k3 KL
with beta 0.04 (after GRPO, arXiv 2402.03300).
"""

from dllm_rl.rl.method import Method, Preset

METHOD = Method(
    name="diffu_grpo", paper="d1, arXiv 2504.12216", recipe="llada-diffu-grpo-gsm8k.yaml",
    preset=Preset(estimator="mean_field", estimator_options={"p_mask_prompt": 0.15}, loss_type="token",
                loss_aggregation="seq_mean", beta=0.04, kl_estimator="k3", advantage="group_zscore",
                scale_rewards="group", estimator_noise="sample"),
)
