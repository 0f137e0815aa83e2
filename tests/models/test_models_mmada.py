"""MMaDA: the family over its published layout, the MAGVIT-v2 encoder and the understanding prompt, checked
against outputs of the published classes on tiny weights (tests/models/fixtures/mmada/README.md)."""

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dllm_rl.errors import UserError
from dllm_rl.models import build_model, load_model, save_model, tiny_config
from dllm_rl.models.families import FAMILIES, detect_family
from dllm_rl.models.magvit import MagvitConfig, MagvitEncoder, load_vq_encoder
from dllm_rl.models.mmada_image import image_transform, understanding_ids

FIX = Path(__file__).parent / "fixtures" / "mmada"
REF = json.loads((FIX / "reference.json").read_text())
OUT = load_file(str(FIX / "reference.safetensors"))
CONFIG = json.loads((FIX / "config.json").read_text())
TINY_VQ = MagvitConfig(ch=32, ch_mult=(1, 2), num_res_blocks=(2, 1), z_channels=13)


def _fill(shapes: dict[str, list[int]], seed: int) -> dict[str, torch.Tensor]:
    """The fixture's weights, rebuilt as the README says: by sorted name, 1-D weights 1 + 0.1 N(0,1), 1-D
    biases 0.1 N(0,1), others N(0,1) / sqrt(fan_in), from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if len(shape) == 1:
            out[name] = (1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = torch.randn(shape, generator=g) / math.sqrt(math.prod(shape[1:]))
    return out


def _lfq_buffers(d: int) -> dict[str, torch.Tensor]:
    """The published quantiser's buffers, written out: code i's bits (most significant first) as +-1."""
    powers = torch.tensor([2 ** (d - 1 - c) for c in range(d)])
    bits = torch.tensor([[(i >> (d - 1 - c)) & 1 for c in range(d)] for i in range(2 ** d)])
    return {"quantize.embedding": bits.float() * 2 - 1, "quantize.power_vals": powers}


def _vq_dir(path: Path, drop: str | None = None, rename: tuple[str, str] | None = None,
            extra: dict[str, torch.Tensor] | None = None) -> Path:
    """A tiny MAGVIT-v2 checkpoint as published (``pytorch_model.bin``, decoder tensors included)."""
    state = {**_fill(REF["vq_tensors"], seed=1), **_lfq_buffers(13), "decoder.conv_in.weight": torch.ones(4, 13, 3, 3)}
    if drop:
        del state[drop]
    if rename:
        state[rename[1]] = state.pop(rename[0])
    state.update(extra or {})
    path.mkdir(parents=True, exist_ok=True)
    torch.save(state, path / "pytorch_model.bin")
    return path


@pytest.fixture(scope="module")
def mmada_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mmada")
    (path / "config.json").write_text(json.dumps(CONFIG))
    save_file(_fill(REF["mmada_tensors"], seed=2), str(path / "model.safetensors"))
    return path


def _names(path: Path) -> set[str]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_transform_pixels_equal_the_published_transform():
    res = REF["transform_resolution"]
    for name in ("wide", "tall"):
        pixels = image_transform(Image.open(FIX / f"{name}.png"), res)
        assert pixels.shape == (3, res, res) and pixels.dtype == torch.float32
        assert torch.equal(pixels, OUT[f"pixels_{name}"]), name
    big = image_transform(Image.open(FIX / "wide.png"))  # the published 512 px, bit for bit
    assert big.shape == (3, 512, 512)
    assert hashlib.sha256(big.numpy().tobytes()).hexdigest() == REF["transform_512_wide_sha256"]


def test_vq_codes_equal_the_published_encoder(tmp_path):
    vq = load_vq_encoder(_vq_dir(tmp_path), TINY_VQ)
    for name in ("wide", "tall"):
        codes = vq.codes(OUT[f"pixels_{name}"][None])
        assert codes.shape == (1, 64) and codes.dtype == torch.long
        assert torch.equal(codes, OUT[f"codes_{name}"]), name
        transformed = image_transform(Image.open(FIX / f"{name}.png"), REF["transform_resolution"])
        assert torch.equal(vq.codes(transformed[None]), OUT[f"codes_{name}"])
    assert OUT["codes_wide"].unique().numel() == 59  # the fixture exercises many codes, not one


def test_default_vq_sizes_have_the_published_tensor_names_and_shapes():
    with torch.device("meta"):
        state = MagvitEncoder().state_dict()
    assert {k: list(v.shape) for k, v in state.items()} == REF["vq_published_tensors"]
    assert len(state) == 192 and MagvitConfig().codebook_size == 8192


@pytest.mark.parametrize("how, message", [
    ({"drop": "encoder.mid.attn_1.q.weight"}, "MAGVIT-v2 tensor 'encoder.mid.attn_1.q.weight' is missing"),
    ({"rename": ("encoder.down.0.block.1.norm1.weight", "encoder.down.0.block.1.norm_1.weight")},
     "MAGVIT-v2 tensor 'encoder.down.0.block.1.norm1.weight' is missing"),
    ({"extra": {"encoder.down.0.attn.0.q.weight": torch.zeros(32, 32, 1, 1)}},
     "unexpected tensor 'encoder.down.0.attn.0.q.weight'"),
    ({"extra": {"encoder.conv_out.weight": torch.zeros(12, 64, 3, 3)}},
     r"tensor 'encoder.conv_out.weight' has shape \(12, 64, 3, 3\), MagvitConfig implies \(13, 64, 3, 3\)"),
    ({"extra": {"quantize.power_vals": torch.arange(13)}}, "'quantize.power_vals' is not the lookup-free"),
])
def test_vq_checkpoint_errors_name_the_tensor_on_one_line(tmp_path, how, message):
    path = _vq_dir(tmp_path / "vq", **how)
    with pytest.raises(UserError, match=message) as err:
        load_vq_encoder(path, TINY_VQ)
    assert "\n" not in str(err.value) and str(path / "pytorch_model.bin") in str(err.value)


def test_vq_directory_without_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="no MAGVIT-v2 weights .*pytorch_model.bin"):
        load_vq_encoder(tmp_path)


def test_mmada_logits_on_an_understanding_batch_equal_the_published_model(mmada_dir):
    model = load_model(mmada_dir)
    assert model.family.name == "mmada" and model.mask_token_id == 126336 and model.eos_token_id == 126081
    rows = [understanding_ids(OUT[f"codes_{k}"][0], REF["chat_ids"][k], REF["code_offset"], vocab_size=134656)
            for k in ("wide", "tall")]
    width = max(r.numel() for r in rows)
    ids = torch.full((2, width), model.eos_token_id)  # left-padded with eos, as published
    for i, r in enumerate(rows):
        ids[i, width - r.numel():] = r
    assert torch.equal(ids, OUT["input_ids"])
    assert ids[0, :3].tolist() == [126089, 126084, 126349 + int(OUT["codes_wide"][0, 0])] and ids[0, 66] == 126085
    with torch.no_grad():
        logits = model(ids).logits  # no attention mask: the published sampler attends the pads too
    assert logits.shape == (2, 80, 134656)
    torch.testing.assert_close(logits[:, :, OUT["columns"]], OUT["logits_at_columns"], atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.logsumexp(logits, -1), OUT["logsumexp"], atol=1e-4, rtol=0)
    assert torch.equal(logits.argmax(-1), OUT["argmax"])


def test_roundtrip_writes_the_published_tensor_names_and_config(mmada_dir, tmp_path):
    model = load_model(mmada_dir)
    save_model(model, tmp_path / "saved", dtype="bfloat16")
    assert _names(tmp_path / "saved") == set(REF["mmada_tensors"])
    assert json.loads((tmp_path / "saved" / "config.json").read_text()) == CONFIG
    again = load_model(tmp_path / "saved")
    assert again.family.name == "mmada"
    assert torch.equal(again.hf_model.model.embed_tokens.weight, model.hf_model.model.embed_tokens.weight.bfloat16())


def test_tiny_mmada_saves_its_vocabulary_split_and_no_auto_map(tmp_path):
    cfg = tiny_config("mmada")
    assert (cfg["llm_vocab_size"], cfg["codebook_size"], cfg["new_vocab_size"]) == (32, 32, 64)
    model = build_model("mmada", cfg, seed=0)
    save_model(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["MMadaModelLM"] and "auto_map" not in saved
    assert (saved["llm_vocab_size"], saved["codebook_size"], saved["d_model"]) == (32, 32, 64)
    x = torch.randint(0, 64, (1, 9))
    torch.testing.assert_close(load_model(tmp_path)(x).logits, model(x).logits, atol=1e-6, rtol=0)


def test_detection_tells_mmada_from_dense_llada():
    assert detect_family(CONFIG).name == "mmada"
    assert detect_family({"model_type": "mmada"}).name == "mmada"
    assert detect_family({**CONFIG, "architectures": ["LLaDAModelLM"], "model_type": "llada"}).name == "llada"
    assert detect_family(tiny_config("llada")).name == "llada"


def test_config_errors_name_the_key():
    fam = FAMILIES["mmada"]
    with pytest.raises(UserError, match="mmada config.json is missing required keys: codebook_size"):
        fam.hf_config({k: v for k, v in CONFIG.items() if k != "codebook_size"})
    with pytest.raises(UserError, match="llm_vocab_size 126464 \\+ codebook_size 9000 exceed the 134656"):
        fam.hf_config({**CONFIG, "codebook_size": 9000})
    with pytest.raises(UserError, match="mmada config.json: scale_logits=True is not supported"):
        fam.hf_config({**CONFIG, "scale_logits": True})


def test_understanding_ids_layout_and_errors():
    assert understanding_ids([0, 5], [7, 8], offset=126349).tolist() == [126089, 126084, 126349, 126354, 126085, 7, 8]
    with pytest.raises(UserError, match="image code 8191 \\+ offset 126464 = 134655 is outside"):
        understanding_ids([8191], [1], offset=126464, vocab_size=134600)
    with pytest.raises(UserError, match="image codes must be >= 0"):
        understanding_ids([-1], [1], offset=126349)


def test_padding_is_published_eos_on_the_left_and_pads_are_not_attended(mmada_dir):
    """The family docstring's padding rule: rows are left-padded with eos 126081 as published, but the pads are
    left out of attention (the published sampler attends them), so a row's logits are those of the published
    model on that row alone. The fixture's wide row needs no padding; the tall row has 2 pads."""
    from dllm_rl.sampling import DecodeConfig, generate

    model = load_model(mmada_dir)
    ids = OUT["input_ids"]
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, :2] = False
    assert model.pad_token_id == 126081 and ids[1, :2].tolist() == [126081, 126081] and ids[1, 2] == 126089
    with torch.no_grad():
        ours = model(ids, attention_mask=valid).logits
        tall_alone = model(ids[1:, 2:]).logits
    # unpadded: the published logits
    torch.testing.assert_close(ours[0, :, OUT["columns"]], OUT["logits_at_columns"][0], atol=1e-4, rtol=0)
    # padded: the row alone, not the published batch (whose tall row attends its 2 pads)
    torch.testing.assert_close(ours[1, 2:], tall_alone[0], atol=1e-5, rtol=0)
    published_gap = (ours[1, 2:, OUT["columns"]] - OUT["logits_at_columns"][1, 2:]).abs().max().item()
    assert published_gap > 1e-2
    # the sampler lays the rows out the same way: eos on the left
    rows = [ids[0].tolist(), ids[1, 2:].tolist()]
    roll = generate(model, rows, DecodeConfig(gen_length=4, block_length=4, steps=4))
    assert roll.prompt_ids[1, :2].tolist() == [126081, 126081] and roll.prompt_mask[1].sum().item() == 78
