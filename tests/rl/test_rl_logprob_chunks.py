"""``logprob_chunk_size`` in the RL config reaches every scoring call of the trainer."""

import pytest
from rl_helpers import digit_reward, rl_overrides

import dllm_rl.rl.update as trainer_mod
from dllm_rl.config import load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.trainer import RLTrainer


@pytest.mark.parametrize(("extra", "want"), [((), 128), (("model.logprob_chunk_size=0",), 0),
                                             (("model.logprob_chunk_size=0",
                                               "estimator_options={logprob_chunk_size: 7}"),
                                              7)])
def test_the_trainer_scores_with_the_configured_chunk_size(rl_setup, tmp_path, monkeypatch, extra, want):
    seen, real = [], trainer_mod.estimate

    def spy(model, name, batch, gen, **opts):
        seen.append(opts.get("logprob_chunk_size"))
        return real(model, name, batch, gen, **opts)

    monkeypatch.setattr(trainer_mod, "estimate", spy)
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=tracerl",
                                                   "train.max_steps=1",
                                                   "drop_zero_variance=false", *extra))
    RLTrainer(cfg, reward_fn=digit_reward).step()
    assert seen and set(seen) == {want}
