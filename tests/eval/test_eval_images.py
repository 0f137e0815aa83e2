"""Evaluation with images: a tiny LLaDA-V and a tiny MMaDA checkpoint evaluated on the shapes task end to end
(images through ``generate``, scores written), and the trace page drawing each prompt's image inline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import dllm_rl.sampling as sampling
from dllm_rl.config.vocabulary import ModelSection
from dllm_rl.eval.harness import EvalRunConfig, read_records, run_eval
from dllm_rl.models import build_model, char_tokenizer, save_model, tiny_config
from dllm_rl.models.magvit import MagvitConfig, MagvitEncoder
from dllm_rl.sampling import DecodeConfig
from dllm_rl.tasks.shapes import make_shapes, write_shapes
from dllm_rl.training.run_config import RunConfig

TINY_VQ = MagvitConfig(ch=32, ch_mult=(1, 2), num_res_blocks=(1, 1), z_channels=5)  # 32 codes, 8x8 at 16 px


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("eval_images")
    tok = char_tokenizer()
    ids = dict(mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    cfg = tiny_config("llada_v", vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, max_position_embeddings=2048, **ids)
    cfg["image_aspect_ratio"] = "pad"  # one 384 px tile: 729 features + 1 newline per image
    save_model(build_model("llada_v", cfg, seed=0), d / "llada_v", tokenizer=tok)
    # MMaDA's special ids are the published ones (<|mmu|> 126089 ...), so the tiny vocabulary keeps the published
    # text size; codes are offset by len(tokenizer) (the published rule), here the character tokenizer's
    codes, text = 2 ** TINY_VQ.z_channels, 126464
    cfg = tiny_config("mmada", vocab_size=text + codes, hidden_size=16, num_layers=1, num_heads=2,
                      num_kv_heads=1, intermediate_size=32, **ids)
    cfg.update(llm_vocab_size=text, codebook_size=codes, new_vocab_size=text + codes)
    save_model(build_model("mmada", cfg, seed=0), d / "mmada", tokenizer=tok)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        vq = MagvitEncoder(TINY_VQ)
    vq_dir = d / "mmada" / "vq_model"
    vq_dir.mkdir()
    save_file({k: v.contiguous() for k, v in vq.state_dict().items()}, str(vq_dir / "model.safetensors"))
    (vq_dir / "config.json").write_text(json.dumps(
        {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": [1, 1], "z_channels": 5, "resolution": 16}))
    write_shapes(d / "shapes.jsonl", make_shapes(3, seed=0, size=32))
    return d


def _cfg(d: Path, family: str, **kw) -> EvalRunConfig:
    return EvalRunConfig(model=ModelSection(path=str(d / family)), task="shapes", data=str(d / "shapes.jsonl"),
                         prompt_style="compact", decode=DecodeConfig(gen_length=8, block_length=8, steps=8),
                         batch_size=2, trace_items=2,
                         run=RunConfig(output_dir=str(d / f"out_{family}"), progress=False), **kw)


def _count_generate(monkeypatch) -> list:
    calls = []
    real = sampling.generate

    def spy(model, prompts, config, **kw):
        calls.append((len(prompts), kw.get("images"), [list(p) for p in prompts]))
        return real(model, prompts, config, **kw)

    monkeypatch.setattr(sampling, "generate", spy)
    return calls


def _check_run(d: Path, family: str, summary: dict) -> list[dict]:
    out = d / f"out_{family}"
    assert summary["items"] == 3 and summary["meta"]["family"] == family
    recs = read_records(out / "items" / "default.jsonl")
    assert sorted(r["index"] for r in recs) == [0, 1, 2]
    assert all(r["prompt"].startswith("<image>\n") and r["nfe"] >= 1 for r in recs)
    page = (out / "traces" / "default.html").read_text()
    data = json.loads(re.search(r'<script id="trace-data" type="application/json">(.*?)</script>', page,
                                re.S).group(1))
    for rec in data["records"]:
        assert len(rec["images"]) == 1 and rec["images"][0].startswith("data:image/png;base64,")
        assert rec["image_positions"] == [0 if family == "llada_v" else 2]
    assert "http" not in page.split("</style>")[1].split("<script")[0]  # nothing outside the page
    return data["records"]


def test_llada_v_eval_on_shapes_passes_images_to_generate(workdir, monkeypatch):
    calls = _count_generate(monkeypatch)
    summary = run_eval(_cfg(workdir, "llada_v"))
    # 2 + 1 items in the run, then 2 for the trace page; each batch with its image features
    assert [n for n, _, _ in calls] == [2, 1, 2]
    assert all(im is not None and [len(s) for s in im.rows] == [1] * n for n, im, _ in calls)
    assert all(f.shape == (730, 32) for _, im, _ in calls for f in im.features)
    records = _check_run(workdir, "llada_v", summary)
    # the 730 image positions are drawn as one image, not as 730 prompt tokens
    assert records[0]["prompt_tokens"][:1] == ["\n"] and len(records[0]["prompt_tokens"]) < 40


def test_mmada_eval_on_shapes_reads_images_as_codes(workdir, monkeypatch):
    calls = _count_generate(monkeypatch)
    summary = run_eval(_cfg(workdir, "mmada"))
    assert [n for n, _, _ in calls] == [2, 1, 2] and all(im is None for _, im, _ in calls)
    records = _check_run(workdir, "mmada", summary)
    for prompt, rec in zip(calls[-1][2], records):  # [<|mmu|>, <|soi|>, 64 codes + len(tokenizer), <|eoi|>, chat]
        assert prompt[:2] == [126089, 126084] and prompt[66] == 126085
        assert all(91 <= c < 91 + 32 for c in prompt[2:66])
        assert len(rec["prompt_tokens"]) == len(prompt) - 64
        assert "<image>" not in "".join(rec["prompt_tokens"])


def test_mmada_without_its_vq_encoder_is_one_line(workdir, tmp_path):
    import shutil

    from dllm_rl.errors import UserError

    shutil.copytree(workdir / "mmada", tmp_path / "m", ignore=shutil.ignore_patterns("vq_model"))
    cfg = EvalRunConfig(model=ModelSection(path=str(tmp_path / "m")), task="shapes",
                        data=str(workdir / "shapes.jsonl"),
                        prompt_style="compact", decode=DecodeConfig(gen_length=8, block_length=8),
                        run=RunConfig(output_dir=str(tmp_path / "o"), progress=False))
    with pytest.raises(UserError, match=r"^MMaDA reads images through a MAGVIT-v2 VQ encoder, and none was found "
                                        r"\(.*m/vq_model\): put the showlab/magvitv2 checkpoint in the model's "
                                        r"vq_model/ folder or set vq_model$"):
        run_eval(cfg)


DECODE = ("--decode.gen-length", "8", "--decode.block-length", "8", "--decode.steps", "8")


def _trace(argv: list[str]) -> list[dict]:
    import argparse

    from dllm_rl.cli import parse_words
    from dllm_rl.eval.cli import register

    parser = argparse.ArgumentParser(prog="dllm-rl")
    register(parser.add_subparsers(dest="command"))
    args = parse_words(parser, ["trace", *argv])
    assert args.func(args) == 0
    page = Path(argv[argv.index("-o") + 1]).read_text()
    return json.loads(re.search(r'<script id="trace-data" type="application/json">(.*?)</script>', page,
                                re.S).group(1))["records"]


def test_trace_draws_a_task_items_image_and_a_prompts_image_files(workdir, monkeypatch):
    calls = _count_generate(monkeypatch)
    out = workdir / "trace_task.html"
    recs = _trace([str(workdir / "llada_v"), "--task", "shapes", "--data", str(workdir / "shapes.jsonl"),
                   "--prompt-style", "compact", "--index", "0", "--index", "2", *DECODE,
                   "-o", str(out)])
    assert [r["label"] for r in recs] == ["shapes item 0", "shapes item 2"]
    assert [len(r["images"]) for r in recs] == [1, 1] and all(r["image_positions"] == [0] for r in recs)
    (n, pim, _), = calls
    assert n == 2 and [f.shape for f in pim.features] == [(730, 32)] * 2  # the images reached the model
    assert all("reward" in r for r in recs)
    # the same picture through --prompt/--image, on MMaDA: drawn after <|mmu|> <|soi|>
    row = json.loads((workdir / "shapes.jsonl").read_text().splitlines()[0])
    picture = workdir / row["image"]
    recs = _trace([str(workdir / "mmada"), "--prompt", "<image>\ncount red circle\n", "--prompt", "nums 1 2",
                   "--image", str(picture), *DECODE, "-o", str(workdir / "t2.html")])
    assert [len(r["images"]) for r in recs] == [1, 0] and recs[0]["image_positions"] == [2]
    assert recs[0]["images"][0] == _trace([str(workdir / "llada_v"), "--prompt", "<image>\ncount red circle\n",
                                          "--image", str(picture), *DECODE,
                                          "-o", str(workdir / "t3.html")])[0]["images"][0]


def test_trace_image_errors_are_one_line(workdir, tmp_path):
    from dllm_rl.errors import UserError
    from dllm_rl.tasks.base import DataError

    model = str(workdir / "llada_v")
    with pytest.raises(UserError, match=r"^--prompt texts hold 1 <image> placeholder\(s\) but 0 --image file"):
        _trace([model, "--prompt", "<image>\ncount red circle\n", "-o", str(tmp_path / "a.html")])
    with pytest.raises(DataError, match="--image nope.png"):
        _trace([model, "--prompt", "<image>\nx\n", "--image", "nope.png", "-o", str(tmp_path / "a.html")])
    tok = char_tokenizer()
    cfg = tiny_config("llada", vocab_size=len(tok), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    save_model(build_model("llada", cfg, seed=0), tmp_path / "llada", tokenizer=tok)
    with pytest.raises(UserError, match=r"^--image was given, but a llada model reads text only"):
        _trace([str(tmp_path / "llada"), "--prompt", "<image>\nx\n", "--image", "a.png", "-o", str(tmp_path / "b")])
    with pytest.raises(UserError, match=r"^the trace's prompts carry images, but a llada model reads text only"):
        _trace([str(tmp_path / "llada"), "--task", "shapes", "--data", str(workdir / "shapes.jsonl"),
                "-o", str(tmp_path / "c.html")])
    # flags that would be ignored are refused: --data without --task, decoding flags with --from-trace
    with pytest.raises(UserError, match=r"^--data FILE names the data of --task NAME"):
        _trace([model, "--prompt", "x", "--data", str(workdir / "shapes.jsonl"), "-o", str(tmp_path / "d.html")])
    with pytest.raises(UserError, match=r"^--from-trace draws a recorded trace"):
        _trace(["--from-trace", str(tmp_path / "t.jsonl"), "--image", "a.png", "-o", str(tmp_path / "e.html")])
