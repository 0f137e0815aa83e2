"""rollout.engine: rollouts and the held-out evaluation decoded by the continuous-batching engine are the ones fixed
batches give (the same tokens, so the same rewards, losses and accuracy), for every kind of rollout the methods
ask for."""

import json

import pytest
from rl_helpers import digit_reward, rl_overrides

from dllm_rl.config import load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train

TIMES = ("time", "seconds", "tok_s", "per_s", "elapsed", "_s")


def _rows(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMES)} for r in rows]


# MDPO's rollouts record every step's prediction (here also with its Running-Confidence Remasking); d-TreeRPO's
# grow trees of partial decodes (prefill + until_block)
# (the engine's RCR itself is checked against generate in tests/sampling/test_sampling_rcr.py)
RCR = ("rollout.remasking=rcr", "rollout.threshold=null", "rollout.steps=4", "eval.threshold=null")


@pytest.mark.parametrize("algorithm, decoding", [("espo", ()), ("mdpo", ()), ("mdpo", RCR), ("d_treerpo", ())],
                         ids=["espo", "mdpo", "mdpo-rcr", "d_treerpo"])
def test_rollout_engine_gives_the_fixed_batch_run(rl_setup, tmp_path, monkeypatch, algorithm, decoding):
    import dllm_rl.sampling.engine as engine_mod

    runs, remasking, real = [], [], engine_mod.Engine.run

    def counted(self, prompts, seeds=None, images=None, prefill=None, record_steps=None, until_block=None):
        runs.append((self.engine.slots, len(prompts), record_steps))
        remasking.append(self.config.remasking)
        return real(self, prompts, seeds, images, prefill, record_steps, until_block)

    monkeypatch.setattr(engine_mod.Engine, "run", counted)
    common = (f"algorithm={algorithm}", "train.max_steps=1", "drop_zero_variance=false", "rollout.threshold=0.5",
              "rollout.batch_size=3", "eval.limit=4", "eval.threshold=0.5", *decoding)
    rows = {}
    for name, extra in (("fixed", ()), ("engine", ("rollout.engine=true",))):
        cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path / name, *common, *extra))
        train(cfg, reward_fn=digit_reward)
        rows[name] = _rows(tmp_path / name)
    assert set(remasking) == {"rcr" if decoding == RCR else "low_confidence"}  # the engine decodes the run's rule
    # held-out before, the step's 8 rollouts (2 prompts x 4), held-out after: all through 3 slots
    record = "sampled" if algorithm == "mdpo" else None
    if algorithm == "d_treerpo":  # the tree's levels: several engine runs between the two evaluations
        assert runs[0] == runs[-1] == (3, 4, None) and len(runs) > 3
    else:
        assert runs == [(3, 4, None), (3, 8, record), (3, 4, None)]
    assert rows["engine"] == rows["fixed"] and any("loss" in r for r in rows["fixed"])
