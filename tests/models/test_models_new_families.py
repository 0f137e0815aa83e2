"""LLaDA2.x, LLaDA-MoE, SDAR-MoE and Fast-dLLM v2 on tiny published-layout checkpoints."""

import dataclasses
import json

import pytest
import torch
from test_models_families import _saved_names  # tests/models is on sys.path

from dllm_rl.models import build_model, load_model, save_model, tiny_config, two_stream_layout
from dllm_rl.models.families import FAMILIES, detect_family
from dllm_rl.sampling import DecodeConfig, generate

NEW = ["llada2", "llada_moe", "sdar_moe", "fast_dllm_v2"]
BLOCK = ["llada2", "sdar_moe", "fast_dllm_v2"]


def _experts(prefix: str, n: int) -> set[str]:
    return {prefix + f"mlp.experts.{j}.{m}_proj.weight" for j in range(n) for m in ("gate", "up", "down")}


def _published_names(family: str, n_layers: int = 2, n_experts: int = 4) -> set[str]:
    """The tensor names of the published checkpoints, written out from their modeling code."""
    if family == "llada2":
        names = {"model.word_embeddings.weight", "model.norm.weight", "lm_head.weight"}
        for i in range(n_layers):
            p = f"model.layers.{i}."
            names |= {p + s for s in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                      "attention.query_key_value.weight", "attention.dense.weight",
                                      "attention.query_layernorm.weight", "attention.key_layernorm.weight")}
            if i == 0:  # first_k_dense_replace = 1
                names |= {p + f"mlp.{m}_proj.weight" for m in ("gate", "up", "down")}
            else:
                names |= {p + "mlp.gate.weight", p + "mlp.gate.expert_bias"}
                names |= {p + f"mlp.shared_experts.{m}_proj.weight" for m in ("gate", "up", "down")}
                names |= _experts(p, n_experts)
        return names
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        names |= {p + s for s in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                  "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                  "self_attn.o_proj.weight")}
        if family == "fast_dllm_v2":
            names |= {p + f"self_attn.{m}_proj.bias" for m in "qkv"}
            names |= {p + f"mlp.{m}_proj.weight" for m in ("gate", "up", "down")}
        else:
            names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight", p + "mlp.gate.weight"}
            names |= _experts(p, n_experts)
    return names


@pytest.mark.parametrize("family", NEW)
def test_roundtrip_has_the_exact_published_key_set_and_config(tmp_path, family):
    model = build_model(family, tiny_config(family), seed=1)
    save_model(model, tmp_path)
    assert _saved_names(tmp_path) == _published_names(family)
    cfg = json.loads((tmp_path / "config.json").read_text())
    fam = FAMILIES[family]
    assert (cfg["model_type"], cfg["architectures"], cfg["auto_map"]) == (
        fam.model_type, list(fam.architectures), fam.auto_map)
    loaded = load_model(tmp_path)
    assert loaded.family.name == family
    x = torch.randint(0, 60, (2, 11))
    torch.testing.assert_close(model(x).logits, loaded(x).logits, atol=1e-6, rtol=0)
    save_model(loaded, tmp_path / "again", max_shard_size="20KB")  # sharded, saved from a loaded model
    assert len(list((tmp_path / "again").glob("model-*.safetensors"))) > 1
    assert _saved_names(tmp_path / "again") == _published_names(family)
    torch.testing.assert_close(load_model(tmp_path / "again")(x).logits, model(x).logits, atol=1e-6, rtol=0)


def test_published_config_keys_and_block_size_keys(tmp_path):
    save_model(build_model("fast_dllm_v2", tiny_config("fast_dllm_v2", block_size=8), seed=0), tmp_path / "f")
    cfg = json.loads((tmp_path / "f" / "config.json").read_text())
    assert cfg["bd_size"] == 8 and "block_size" not in cfg and load_model(tmp_path / "f").block_size == 8
    published = {k: v for k, v in tiny_config("llada2").items() if k != "block_size"}  # as released
    save_model(build_model("llada2", published, seed=0), tmp_path / "l")
    cfg = json.loads((tmp_path / "l" / "config.json").read_text())
    assert "block_size" not in cfg and load_model(tmp_path / "l").block_size == 32  # a sampler setting
    save_model(build_model("llada2", tiny_config("llada2", block_size=8), seed=0), tmp_path / "l8")
    assert json.loads((tmp_path / "l8" / "config.json").read_text())["block_size"] == 8
    assert (cfg["partial_rotary_factor"], cfg["num_shared_experts"], cfg["n_group"]) == (0.5, 1, 2)
    save_model(build_model("llada_moe", tiny_config("llada_moe"), seed=0), tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (cfg["model_type"], cfg["moe_layer_freq"], cfg["expert_intermediate_size"]) == ("llada", [1, 1], 16)
    assert "intermediate_size" not in cfg and cfg["dense_intermediate_size"] == 128


def test_detection_tells_llada_moe_from_llada_by_architectures():
    assert detect_family({"model_type": "llada", "architectures": ["LLaDAMoEModelLM"]}).name == "llada_moe"
    assert detect_family({"model_type": "llada", "architectures": ["LLaDAModelLM"]}).name == "llada"
    assert detect_family({"model_type": "llada2_moe"}).name == "llada2"
    assert detect_family({"architectures": ["SDARMoeForCausalLM"]}).name == "sdar_moe"
    assert detect_family({"auto_map": {"AutoModel": "modeling.Fast_dLLM_QwenForCausalLM"}}).name == "fast_dllm_v2"
    assert detect_family({"model_type": "sdar_moe_chat"}).name == "sdar_moe"


def test_unsupported_published_options_are_refused():
    cfg = tiny_config("llada2")
    with pytest.raises(ValueError, match=r"llada2 config.json: use_bias=True is not supported"):
        FAMILIES["llada2"].hf_config({**cfg, "use_bias": True})
    with pytest.raises(ValueError, match="llada2 config.json: use_bias=True"):  # the published class default
        FAMILIES["llada2"].hf_config({k: v for k, v in cfg.items() if k != "use_bias"})
    with pytest.raises(ValueError, match="llada_moe config.json: shared_expert_intermediate_size=32"):
        FAMILIES["llada_moe"].hf_config({**tiny_config("llada_moe"), "shared_expert_intermediate_size": 32})


@pytest.mark.parametrize("family", NEW)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_left_padding_changes_no_real_token(family, attn):
    """Padding is masked out of attention, and padding tokens routed through the experts change no real
    token (HF's MoE has no expert capacity, so nothing is dropped either)."""
    model = build_model(family, tiny_config(family), seed=0, attn_implementation=attn)
    seqs = [torch.randint(0, 60, (n,)) for n in (9, 5, 2)]
    T = max(len(s) for s in seqs)
    ids = torch.full((3, T), model.pad_token_id)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, T - len(s):] = s
        mask[i, T - len(s):] = 1
    batched = model(ids, attention_mask=mask).logits
    for i, s in enumerate(seqs):
        torch.testing.assert_close(batched[i, T - len(s):], model(s[None]).logits[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", BLOCK)
def test_block_cache_gives_the_tokens_of_no_cache(family):
    model = build_model(family, tiny_config(family, block_size=4), seed=3)
    prompts = [[5, 9, 11, 3, 7], [2, 4], [8, 1, 6, 9, 10, 12, 13]]
    for config in (DecodeConfig(gen_length=8, threshold=0.5, stop_on_eos=False),
                   DecodeConfig(gen_length=8, temperature=1.0, stop_on_eos=False, seed=4)):
        cached = generate(model, prompts, config)
        plain = generate(model, prompts, config, block_cache=False)
        assert torch.equal(cached.completion_ids, plain.completion_ids)
        assert torch.equal(cached.step_map, plain.step_map)
        assert int(cached.nfe.sum()) == int(plain.nfe.sum())


def test_fast_dllm_v2_sub_blocks_finish_in_order_with_the_exact_cache():
    """Blocks of 8 in sub-blocks of 4: in every block each sub-block's last commit precedes the next one's first,
    and the block cache gives the tokens and steps of no cache (sampled and greedy)."""
    model = build_model("fast_dllm_v2", tiny_config("fast_dllm_v2", block_size=8), seed=3)
    prompts = [[5, 9, 11, 3, 7], [2, 4], [8, 1, 6, 9, 10, 12, 13, 14, 2]]
    for config in (DecodeConfig(gen_length=16, threshold=0.02, sub_block=4, stop_on_eos=False),
                   DecodeConfig(gen_length=16, threshold=0.02, sub_block=4, temperature=1.0, stop_on_eos=False,
                                seed=4)):
        cached = generate(model, prompts, config)
        plain = generate(model, prompts, config, block_cache=False)
        assert torch.equal(cached.completion_ids, plain.completion_ids)
        assert torch.equal(cached.step_map, plain.step_map)
        whole = generate(model, prompts, dataclasses.replace(config, sub_block=None))
        assert int(whole.nfe.sum()) < int(cached.nfe.sum())  # sub-blocks allow less parallelism
        for i, p in enumerate(prompts):
            steps = cached.step_map[i][cached.completion_mask[i]].tolist()
            start = len(p) % 8  # completion slots before the first block boundary
            cols = [start + k for k in range(len(steps))]  # completion slot k sits at block column (start + k)
            by_sub: dict[int, list[int]] = {}
            for c, st in zip(cols, steps):
                by_sub.setdefault(c // 4, []).append(st)
            subs = [by_sub[k] for k in sorted(by_sub)]
            assert all(max(a) < min(b) for a, b in zip(subs, subs[1:])), (i, subs)


@pytest.mark.parametrize("family", BLOCK)
def test_two_stream_scoring_equals_direct_forwards(family):
    """Noisy block j in the two-stream layout scores what a direct forward of [clean blocks < j | noisy j]
    gives (for Fast-dLLM v2's shifted logits through the scorer's raw-column map)."""
    from dllm_rl.estimators.scoring import _shifted_columns

    bs, R = 4, 10
    model = build_model(family, tiny_config(family, block_size=bs), seed=5)
    assert model.block_size == bs
    g = torch.Generator().manual_seed(0)
    prompt_lens = (6, 3)
    rows = []
    for P in prompt_lens:
        p, r = torch.randint(0, 60, (P,), generator=g), torch.randint(0, 60, (R,), generator=g)
        n = r.clone()
        n[torch.rand(R, generator=g) < 0.5] = model.mask_token_id
        rows.append((p, r, n))
    T = max(prompt_lens) + R
    clean = torch.full((2, T), model.pad_token_id)
    noisy = clean.clone()
    valid = torch.zeros(2, T, dtype=torch.bool)
    for i, (p, r, n) in enumerate(rows):
        off = T - len(p) - R
        clean[i, off:], noisy[i, off:], valid[i, off:] = torch.cat([p, r]), torch.cat([p, n]), True
    layout = two_stream_layout(clean, noisy, valid, torch.tensor(prompt_lens), bs, model.pad_token_id)
    out = model(layout.input_ids, attn_bias=layout.bias, position_ids=layout.position_ids, align=False).logits
    if model.family.shift:
        src = _shifted_columns(layout, bs)
        logits = out.gather(1, src[..., None].clamp(min=0).expand(-1, -1, out.shape[-1]))
    else:
        logits = out[:, layout.seq_len:]
    for i, (p, r, n) in enumerate(rows):
        P, off = len(p), T - len(p) - R
        for j, c in enumerate(layout.noisy_columns[i].tolist()):
            if c < off + P:
                continue  # a prompt token's copy is not scored
            q = c - off
            lo = q // bs * bs
            direct = model(torch.cat([torch.cat([p, r])[:lo], torch.cat([p, n])[lo:lo + bs]])[None]).logits[0, q]
            torch.testing.assert_close(logits[i, j], direct, atol=1e-5, rtol=0)


def test_generate_preset_fills_the_published_schedule(tmp_path, capsys):
    from dllm_rl.cli import build_parser, parse_words
    from dllm_rl.config.command import load_command
    from dllm_rl.sampling.config import GenerateConfig

    def decode(*flags):
        args = parse_words(build_parser("generate"), ["generate", "m", *flags])
        return load_command(GenerateConfig, args, "", positional="model.path").decode.decode_config()

    assert decode("--decode.preset", "llada2").threshold == 0.95
    config = decode("--decode.preset", "fast_dllm_v2", "--decode.threshold", "0.7")
    assert config.threshold == 0.7  # a given key wins
    assert config.sub_block == 8  # Fast-dLLM v2's sub-blocks
    assert decode("--decode.preset", "fast_dllm_v2", "--decode.sub-block", "16").sub_block == 16
