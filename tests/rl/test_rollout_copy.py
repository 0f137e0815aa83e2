"""RolloutCopy with rollout.compile: the compiled copy computes what the live policy computes, after every
refresh, and one compile serves every batch size and width. rollout_dtype / native_bfloat16: which dtype
rollouts decode in for each rollout.dtype setting and device."""

import pytest
import torch
from rl_helpers import needs_cxx
from torch._dynamo.utils import counters

from dllm_rl.config import ConfigError
from dllm_rl.models import build_model, load_model, tiny_config
from dllm_rl.rl.rollout_copy import RolloutCopy, native_bfloat16, rollout_dtype


@needs_cxx
def test_compiled_copy_follows_the_policy_through_refreshes_and_shapes():
    # One layer: the compile (minutes on a fresh clone's empty inductor cache) grows with the layers it traces,
    # and a second layer would run the same kernels again.
    policy = build_model("llada", tiny_config("llada", vocab_size=64, hidden_size=32, intermediate_size=64,
                                              num_heads=2, num_kv_heads=1, num_layers=1, mask_token_id=63)).eval()
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


@pytest.mark.parametrize(("machine", "amx", "avx512_bf16", "mkldnn_bf16", "want"), [
    ("x86_64", True, True, False, "AMX"),
    ("x86_64", False, True, False, "AVX512-BF16"),
    ("x86_64", False, False, True, None),  # oneDNN's check counts AVX512 emulation: not asked on x86
    ("aarch64", False, False, True, "aarch64 BF16"),
    ("aarch64", False, False, False, None),
])
def test_native_bfloat16_reads_the_cpus_instructions(monkeypatch, machine, amx, avx512_bf16, mkldnn_bf16, want):
    import dllm_rl.rl.rollout_copy as mod

    monkeypatch.setattr(mod.platform, "machine", lambda: machine)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: mkldnn_bf16)
    assert native_bfloat16("cpu") == want
    assert native_bfloat16("meta") is None


def test_native_bfloat16_without_torchs_checks_is_no_support(monkeypatch):
    import dllm_rl.rl.rollout_copy as mod

    monkeypatch.setattr(mod.platform, "machine", lambda: "x86_64")
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert native_bfloat16("cpu") is None


@pytest.mark.parametrize(("requested", "policy", "native", "want", "note"), [
    (None, torch.float32, "AMX", torch.float32, None),
    ("auto", torch.float32, "AMX", torch.bfloat16, "rollout.dtype=auto: rollouts decoded by a bfloat16 copy (AMX)"),
    ("auto", torch.float32, None, torch.float32,
     "rollout.dtype=auto: rollouts decoded in float32 (no native bfloat16 on this device)"),
    ("auto", torch.bfloat16, None, torch.bfloat16, None),
    ("float32", torch.float32, None, torch.float32, None),
    ("bf16", torch.float32, "AVX512-BF16", torch.bfloat16, None),
    ("bfloat16", torch.float32, None, torch.bfloat16, "warning: rollout.dtype=bfloat16 on a CPU without AMX"),
])
def test_rollout_dtype_for_each_setting(monkeypatch, requested, policy, native, want, note):
    import dllm_rl.rl.rollout_copy as mod

    monkeypatch.setattr(mod, "native_bfloat16", lambda device: native)
    dtype, said = rollout_dtype(requested, policy, "cpu")
    assert dtype == want
    assert (said is None) == (note is None) and (said or "").startswith(note or "")
