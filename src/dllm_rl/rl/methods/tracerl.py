"""TraceRL: trajectory-aware RL (arXiv 2509.06949).

The inference trace is the policy's action sequence: the ``trace`` estimator scores the tokens each decoding
step committed, given the state before that step (shrinkage ``s`` merges ``s`` consecutive steps: 1 on block
models, 8 on full attention, the paper's settings, resolved per attention kind when the preset is filled). Token-level
clipped ratio, k3 KL with beta 0.01, GRPO advantages; its diffusion value model is ``value_model.enabled``
(:mod:`dllm_rl.rl.value`).
"""

from dllm_rl.rl.method import Method, Preset

METHOD = Method(
    name="tracerl", paper="TraceRL, arXiv 2509.06949", recipe="trado-tracerl-math.yaml",
    preset=Preset(estimator="trace", estimator_options={}, loss_type="token", loss_aggregation="token_mean",
                beta=0.01, kl_estimator="k3", advantage="group_zscore", scale_rewards="group",
                estimator_noise="sample"),
    notes={"estimator": "s = 1 block, 8 full"},
)
