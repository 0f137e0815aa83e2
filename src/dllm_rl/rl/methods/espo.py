"""ESPO: ELBO-based sequence-level policy optimization (arXiv 2512.03759).

The whole completion is one action whose log-likelihood proxy is the ELBO (two coupled draws), with a
sequence-level ratio ``exp((E_new - E_old) / L)`` (eq. 7-9, the ``sequence`` loss), k2 KL at sequence level with
beta 0.01 (its ``train.yaml``; 3e-3 for Countdown) and leave-one-out advantages, unscaled.

Ours: a prompt's rollouts share the ELBO's masks (``estimator_noise=group``), so the leave-one-out gradients on
the tokens they share cancel (benchmarks/LEARNING.md: it lifted ESPO on both demo models).
"""

from dllm_rl.rl.method import Method, Preset

METHOD = Method(
    name="espo", paper="ESPO, arXiv 2512.03759", recipe="llada-espo-gsm8k.yaml",
    preset=Preset(estimator="elbo", estimator_options={"num_mc": 2, "coupled": True}, loss_type="sequence",
                loss_aggregation="seq_mean", beta=0.01, kl_estimator="k2", advantage="leave_one_out",
                scale_rewards="none", estimator_noise="group"),
)
