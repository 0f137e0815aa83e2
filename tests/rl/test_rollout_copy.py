"""RolloutCopy with rollout.compile: the compiled copy computes what the live policy computes, after every
refresh, and one compile serves every batch size and width."""

import pytest
import torch
from rl_helpers import needs_cxx
from torch._dynamo.utils import counters

from dllm_rl.config import ConfigError
from dllm_rl.models import load_model
from dllm_rl.rl.rollout_copy import RolloutCopy


@needs_cxx
def test_compiled_copy_follows_the_policy_through_refreshes_and_shapes(rl_setup):
    policy = load_model(rl_setup / "llada").eval()
    copy_ = RolloutCopy(policy, torch.float32, compile=True)
    gen = torch.Generator().manual_seed(0)

    def check(batch: int, width: int) -> torch.Tensor:
        ids = torch.randint(3, policy.config.vocab_size, (batch, width), generator=gen)
        with torch.no_grad():
            want, got = policy(ids).logits, copy_.refresh()(ids).logits
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        return ids

    ids = check(4, 12)
    with torch.no_grad():
        before = copy_.model(ids).logits
        for p in policy.parameters():  # an update the refresh must carry into the compiled graph
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    check(4, 12)
    with torch.no_grad():
        assert (copy_.model(ids).logits - before).abs().max() > 0.1
    frames = counters["stats"]["unique_graphs"]
    assert frames >= 1
    check(7, 20)  # another batch size and width: the dynamic-shape graph, no recompile
    check(3, 9)
    assert counters["stats"]["unique_graphs"] == frames


def test_compile_without_a_cxx_compiler_fails_with_the_key_and_the_way_out(rl_setup, monkeypatch):
    import dllm_rl.rl.rollout_copy as mod

    monkeypatch.setattr(mod.shutil, "which", lambda name: None)
    policy = load_model(rl_setup / "llada")
    with pytest.raises(ConfigError, match=r"rollout.compile: .*no C\+\+ compiler.*rollout.compile=false"):
        RolloutCopy(policy, torch.float32, compile=True)
    assert RolloutCopy(policy, torch.bfloat16).model.dtype == torch.bfloat16  # without compile: no compiler needed
