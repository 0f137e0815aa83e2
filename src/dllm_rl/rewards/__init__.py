"""Rewards: everything that scores a completion, without the trainer.

The ``reward:`` section (:mod:`~dllm_rl.rewards.config`); a weighted sum of reward terms
(:mod:`~dllm_rl.rewards.reward_terms`): task verifiers, sequence-classification reward models
(:mod:`~dllm_rl.rewards.reward_model`), LLM judges (:mod:`~dllm_rl.rewards.judge` with its prompt and parsing in
:mod:`~dllm_rl.rewards.judge_text`, its section in :mod:`~dllm_rl.rewards.judge_config` and its generators in
:mod:`~dllm_rl.rewards.judge_backends`) and decoding speed (:mod:`~dllm_rl.rewards.speed`); and the guards that keep a
reward from crashing, ending or faking a run (:mod:`~dllm_rl.rewards.safe`). Nothing here imports the trainers
(``rl``, ``sft``), so ``eval`` and ``dpo`` can score with the same code. Importing the package loads none of them.
"""
