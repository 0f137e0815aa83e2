import json

import pytest
import torch
from safetensors.torch import save_file

from dllm_rl.models import build_model, load_model, save_model, tiny_config
from dllm_rl.models.families import FAMILIES, detect_family, get_family

FAMS = ["llada", "dream", "sdar"]
ALL = "llada, dream, sdar, llada2, llada_moe, sdar_moe, fast_dllm_v2, mmada, llada_v"


def _published_names(family: str, n_layers: int) -> set[str]:
    if family == "llada":
        names = {"model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight"}
        for i in range(n_layers):
            for t in ("attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out"):
                names.add(f"model.transformer.blocks.{i}.{t}.weight")
        return names
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        names |= {p + s for s in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                  "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                  "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                  "mlp.down_proj.weight")}
        if family == "dream":
            names |= {p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"}
        if family == "sdar":
            names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
    return names


def _saved_names(path) -> set[str]:
    from safetensors import safe_open

    names = set()
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            names |= set(h.keys())
    return names


@pytest.mark.parametrize("family", FAMS)
def test_save_load_roundtrip_published_names(tmp_path, family):
    model = build_model(family, tiny_config(family), seed=1)
    save_model(model, tmp_path)
    assert _saved_names(tmp_path) == _published_names(family, 2)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == FAMILIES[family].model_type
    assert cfg["architectures"] == list(FAMILIES[family].architectures)
    loaded = load_model(tmp_path)
    assert loaded.family.name == family
    x = torch.randint(0, 60, (2, 11))
    torch.testing.assert_close(model(x).logits, loaded(x).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMS)
def test_sharded_checkpoint_loads(tmp_path, family):
    model = build_model(family, tiny_config(family), seed=2)
    save_model(model, tmp_path, max_shard_size="30KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    x = torch.randint(0, 60, (1, 9))
    torch.testing.assert_close(model(x).logits, load_model(tmp_path)(x).logits, atol=1e-6, rtol=0)


def test_hand_written_llada_checkpoint_loads_with_published_maths(tmp_path):
    """A checkpoint written tensor by tensor in the LLaDA layout computes the documented maths."""
    torch.manual_seed(0)
    H, F, V, nh = 16, 24, 32, 2
    cfg = tiny_config("llada", vocab_size=V, hidden_size=H, num_layers=1, num_heads=nh, num_kv_heads=nh,
                      intermediate_size=F)
    t = {
        "model.transformer.wte.weight": torch.randn(V, H),
        "model.transformer.ln_f.weight": torch.rand(H) + 0.5,
        "model.transformer.ff_out.weight": torch.randn(V, H) * 0.2,
        "model.transformer.blocks.0.attn_norm.weight": torch.rand(H) + 0.5,
        "model.transformer.blocks.0.ff_norm.weight": torch.rand(H) + 0.5,
        "model.transformer.blocks.0.q_proj.weight": torch.randn(H, H) * 0.2,
        "model.transformer.blocks.0.k_proj.weight": torch.randn(H, H) * 0.2,
        "model.transformer.blocks.0.v_proj.weight": torch.randn(H, H) * 0.2,
        "model.transformer.blocks.0.attn_out.weight": torch.randn(H, H) * 0.2,
        "model.transformer.blocks.0.ff_proj.weight": torch.randn(F, H) * 0.2,
        "model.transformer.blocks.0.up_proj.weight": torch.randn(F, H) * 0.2,
        "model.transformer.blocks.0.ff_out.weight": torch.randn(H, F) * 0.2,
    }
    save_file(t, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_model(tmp_path)
    x = torch.tensor([[3, 7, 1, 30, 5]])

    # Reference: the published LLaDA block maths, written out (bidirectional attention, RoPE rotate_half).
    def rms(h, w, eps=1e-5):
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))

    b = "model.transformer.blocks.0."
    hd, T = H // nh, x.shape[1]
    h = t["model.transformer.wte.weight"][x]
    a = rms(h, t[b + "attn_norm.weight"])
    q = (a @ t[b + "q_proj.weight"].T).view(1, T, nh, hd).transpose(1, 2)
    k = (a @ t[b + "k_proj.weight"].T).view(1, T, nh, hd).transpose(1, 2)
    v = (a @ t[b + "v_proj.weight"].T).view(1, T, nh, hd).transpose(1, 2)
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rot(u):
        u1, u2 = u[..., : hd // 2], u[..., hd // 2:]
        return u * cos + torch.cat([-u2, u1], -1) * sin

    att = torch.softmax(rot(q) @ rot(k).transpose(-1, -2) / hd**0.5, -1) @ v
    h = h + att.transpose(1, 2).reshape(1, T, H) @ t[b + "attn_out.weight"].T
    m = rms(h, t[b + "ff_norm.weight"])
    h = h + (torch.nn.functional.silu(m @ t[b + "ff_proj.weight"].T) * (m @ t[b + "up_proj.weight"].T)) @ t[
        b + "ff_out.weight"].T
    ref = rms(h, t["model.transformer.ln_f.weight"]) @ t["model.transformer.ff_out.weight"].T
    torch.testing.assert_close(model(x).logits, ref, atol=1e-5, rtol=1e-5)


def test_llada_weight_tying_roundtrip(tmp_path):
    model = build_model("llada", tiny_config("llada", tie_word_embeddings=True), seed=3)
    save_model(model, tmp_path)
    assert "model.transformer.ff_out.weight" not in _saved_names(tmp_path)
    x = torch.randint(0, 60, (1, 7))
    torch.testing.assert_close(model(x).logits, load_model(tmp_path)(x).logits, atol=1e-6, rtol=0)


def test_bfloat16_load(tmp_path):
    model = build_model("sdar", tiny_config("sdar"), seed=4)
    save_model(model, tmp_path)
    m16 = load_model(tmp_path, dtype="bfloat16")
    assert m16.dtype == torch.bfloat16
    x = torch.randint(0, 60, (1, 8))
    torch.testing.assert_close(m16(x).logits.float(), model(x).logits, atol=0.1, rtol=0.05)


def test_detect_family_from_architectures_and_auto_map():
    assert detect_family({"architectures": ["LLaDAModelLM"]}).name == "llada"
    assert detect_family({"model_type": "Dream"}).name == "dream"
    assert detect_family({"auto_map": {"AutoModel": "modeling_sdar.SDARForCausalLM"}}).name == "sdar"


def test_unknown_family_lists_supported(tmp_path):
    with pytest.raises(ValueError, match=f"supported families: {ALL}"):
        detect_family({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "x/config.json")
    with pytest.raises(ValueError, match=f"supported: {ALL}"):
        get_family("mamba")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match=str(tmp_path / "config.json")):
        load_model(tmp_path)


def test_missing_shard_names_the_file(tmp_path):
    save_model(build_model("dream", tiny_config("dream"), seed=0), tmp_path, max_shard_size="30KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        load_model(tmp_path)


def test_shape_mismatch_names_tensor_and_file(tmp_path):
    save_model(build_model("sdar", tiny_config("sdar"), seed=0), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    pattern = r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.\w+_proj\.weight' has shape"
    with pytest.raises(ValueError, match=pattern):
        load_model(tmp_path)


def test_missing_config_and_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("llada")))
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_model(tmp_path)
