"""``dllm-rl dpo``: offline preference training of diffusion LMs with VRPO (LLaDA 1.5, arXiv 2505.19223).

DPO with ELBO log-likelihoods (:mod:`~dllm_rl.dpo.loss`), scored by the ``vrpo`` estimator
(:mod:`dllm_rl.estimators.vrpo`: stratified mask counts, the same masks for the policy and the reference); pairs of
``prompt`` / ``chosen`` / ``rejected`` rows (:mod:`~dllm_rl.dpo.data`); the SFT trainer's loop, checkpoints, resume,
LoRA and sharded backends (:mod:`~dllm_rl.dpo.trainer`); pairs from a model's own right and wrong answers
(:mod:`~dllm_rl.dpo.pairs`, ``dllm-rl pairs``).

Not an RL method module (``rl/methods/``): the RL methods are presets of the online loop (rollouts, rewards,
advantages, a policy loss per token or sequence); VRPO has no rollout, reward or advantage, and its loss couples two
sequences (chosen and rejected) through a reference, which the per-sample loss signature cannot express.
"""
