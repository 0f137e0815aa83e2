"""The evaluation harness: exact metrics, resumability, settings, and clear errors before any compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import dllm_rl.models.loading as loading
import dllm_rl.sampling as sampling
from dllm_rl.config.vocabulary import ModelSection
from dllm_rl.errors import UserError
from dllm_rl.eval.harness import EvalRunConfig, read_records, run_eval, sample_seed
from dllm_rl.eval.passk import pass_at_k
from dllm_rl.eval.settings import Setting, load_settings_file, parse_setting, resolve_decode
from dllm_rl.models import build_model, char_tokenizer, save_model, tiny_config
from dllm_rl.sampling import DecodeConfig, Rollout
from dllm_rl.training.run_config import RunConfig

# Countdown items in the d1/ESPO file format; compact prompts are "nums a b c target t\n".
ITEMS = [(1, 2, 3), (4, 5, 6), (7, 8, 9), (2, 3, 4), (5, 5, 5), (1, 1, 1)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("eval")
    tok = char_tokenizer()
    for fam in ("llada", "sdar"):
        cfg = tiny_config(fam, vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                          intermediate_size=64, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
        save_model(build_model(fam, cfg, seed=0), d / fam, tokenizer=tok)
    # A model whose vocabulary is smaller than the tokenizer, and one with another mask id.
    cfg = tiny_config("llada", vocab_size=40, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id)
    save_model(build_model("llada", cfg), d / "small_vocab", tokenizer=tok)
    cfg = tiny_config("llada", vocab_size=len(tok), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, mask_token_id=5, eos_token_id=tok.eos_token_id)
    save_model(build_model("llada", cfg), d / "other_mask", tokenizer=tok)
    (d / "cd.jsonl").write_text("".join(json.dumps({"input": f"{a},{b},{c}", "output": str(a + b + c)}) + "\n"
                                        for a, b, c in ITEMS))
    return d


def _cfg(d: Path, out: str, **kw) -> EvalRunConfig:
    base = dict(model_dir=str(d / "llada"), task=str(d / "cd.jsonl"), output_dir=str(d / out),
                task_options={"task_type": "countdown"}, prompt_style="compact",
                decode={"gen_length": 8, "block_length": 8}, batch_size=4, progress=False)
    base.update(kw)
    run = {k: base.pop(k) for k in ("output_dir", "seed", "overwrite", "progress") if k in base}
    model, decode = ModelSection(path=base.pop("model_dir")), DecodeConfig(**base.pop("decode"))
    return EvalRunConfig(**base, model=model, decode=decode, run=RunConfig(**run))


def _strip_time(recs):
    return [{k: v for k, v in r.items() if k != "gen_seconds"} for r in recs]


def _metrics(summary):
    drop = ("tokens_per_s", "gen_seconds")
    return {n: {k: v for k, v in s["metrics"].items() if k not in drop} for n, s in summary["settings"].items()}


# ------------------------------------------------------------------------------------------ canned decoding
def _fake_generate(calls: list[int]):
    """A stand-in for sampling.generate: item (a, b, c) answers correctly iff its seed is even; NFE is
    gen_length for static settings and 3 for threshold settings; the answer length is len(text) + 1 (EOS)."""

    def fake(model, prompts, config, seeds=None, tokenizer=None, progress=False, *, block_cache=True, images=None):
        assert images is None  # a text task
        calls.append(len(prompts))
        texts = []
        for p, seed in zip(prompts, seeds):
            nums = tokenizer.decode(p).split()[1:4]
            expr = "+".join(nums) if seed % 2 == 0 else "*".join(nums)
            texts.append(f"<answer>{expr}</answer>")
        B, G = len(prompts), config.gen_length
        lengths = torch.tensor([len(t) + 1 for t in texts])
        width = max(G, int(lengths.max()))
        cols = torch.arange(width)
        return Rollout(
            prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.bool),
            completion_ids=torch.zeros(B, width, dtype=torch.long), completion_mask=cols < lengths[:, None],
            step_map=torch.where(cols < lengths[:, None], cols, -1),
            nfe=torch.full((B,), 3 if config.threshold is not None else G), finish_reason=["eos"] * B, texts=texts)

    return fake


def _expected_correct(i: int, s: int, seed: int = 0) -> bool:
    a, b, c = ITEMS[i]
    return sample_seed(seed, i, s) % 2 == 0 or a * b * c == a + b + c  # (1,2,3): 1*2*3 == 1+2+3


def test_metrics_are_exact_with_canned_completions(workdir, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(sampling, "generate", _fake_generate(calls))
    cfg = _cfg(workdir, "canned", num_samples=3, decode={"gen_length": 32, "block_length": 8, "temperature": 1.0},
               setting=["static:tokens_per_step=1", "dyn:threshold=0.9"])
    summary = run_eval(cfg, model=loading.load_model(workdir / "llada"), log=lambda m: None)
    assert sum(calls) == 2 * len(ITEMS) * 3
    counts = [sum(_expected_correct(i, s) for s in range(3)) for i in range(len(ITEMS))]
    lengths = [len(f"<answer>{'+'.join(map(str, it))}</answer>") + 1 for it in ITEMS]  # same length either way
    for name, nfe in (("static", 32), ("dyn", 3)):
        m = summary["settings"][name]["metrics"]
        assert m["items"] == 6 and m["samples"] == 18 and m["samples_per_item"] == 3
        assert m["accuracy"] == pytest.approx(sum(counts) / 18)
        assert m["pass_at_k"]["1"] == pytest.approx(sum(counts) / 18)
        assert m["pass_at_k"]["2"] == pytest.approx(sum(pass_at_k(3, c, 2) for c in counts) / 6)
        assert m["pass_at_k"]["3"] == pytest.approx(sum(c > 0 for c in counts) / 6)
        assert m["mean_length"] == pytest.approx(sum(lengths) / 6)
        assert m["nfe_mean"] == nfe
        assert m["nfe_per_token"] == pytest.approx(nfe * 6 / sum(lengths))
        assert m["finish_reasons"] == {"eos": 18}
    # Per-sample records: prompt, completion, reward, reason, seed.
    recs = read_records(workdir / "canned" / "items" / "static.jsonl")
    first = next(r for r in recs if r["index"] == 1 and r["sample"] == 0)
    assert first["prompt"] == "nums 4 5 6 target 15\n"
    assert first["seed"] == sample_seed(0, 1, 0)
    ok = sample_seed(0, 1, 0) % 2 == 0
    assert first["completion"] == ("<answer>4+5+6</answer>" if ok else "<answer>4*5*6</answer>")
    assert first["reward"] == (1.0 if ok else 0.0) and first["correct"] is ok
    assert first["reason"] and first["reference"]["target"] == 15
    # Reports and metadata.
    out = workdir / "canned"
    saved = json.loads((out / "summary.json").read_text())
    assert saved["settings"]["static"]["decode"]["steps"] == 8  # tokens_per_step=1 over blocks of 8
    assert saved["settings"]["dyn"]["decode"]["threshold"] == 0.9
    meta = saved["meta"]
    for key in ("dllm_rl", "torch", "transformers", "device", "dtype"):
        assert key in meta["environment"]
    assert meta["seed"] == 0 and meta["dtype"] == "float32" and meta["num_samples"] == 3
    assert len(meta["data"]["sha256"]) == 64 and len(meta["model"]["weights"]["model.safetensors"]) == 64
    md = (out / "summary.md").read_text()
    assert "| static |" in md and "| dyn |" in md and "pass@2" in md and "pass@3" in md
    assert (out / "accuracy_vs_nfe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_interrupted_evaluation_resumes_to_identical_numbers(workdir, monkeypatch):
    settings = ["s1:tokens_per_step=1", "s2:tokens_per_step=2"]
    common = dict(num_samples=2, decode={"gen_length": 8, "block_length": 8, "temperature": 0.7}, setting=settings,
                  batch_size=3)
    model = loading.load_model(workdir / "llada")
    full = run_eval(_cfg(workdir, "full", **common), model=model, log=lambda m: None)

    real = sampling.generate
    calls: list[int] = []

    def crash_on_third(*args, **kwargs):
        calls.append(len(args[1]))
        if len(calls) == 3:
            raise KeyboardInterrupt  # killed in the middle of setting s1 (12 samples, batches of 3)
        return real(*args, **kwargs)

    monkeypatch.setattr(sampling, "generate", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        run_eval(_cfg(workdir, "resumed", **common), model=model, log=lambda m: None)
    items = workdir / "resumed" / "items" / "s1.jsonl"
    assert len(read_records(items)) == 6
    with open(items, "a") as fh:  # a torn line, as a kill during a write leaves
        fh.write('{"setting": "s1", "index": 5, "sa')

    calls.clear()
    monkeypatch.setattr(sampling, "generate", lambda *a, **k: (calls.append(len(a[1])), real(*a, **k))[1])
    resumed = run_eval(_cfg(workdir, "resumed", **common), model=model, log=lambda m: None)
    assert sum(calls) == 2 * 12 - 6  # only the unfinished samples were decoded
    assert _metrics(resumed) == _metrics(full)
    for name in ("s1", "s2"):
        a = sorted(_strip_time(read_records(workdir / "full" / "items" / f"{name}.jsonl")),
                   key=lambda r: (r["index"], r["sample"]))
        b = sorted(_strip_time(read_records(workdir / "resumed" / "items" / f"{name}.jsonl")),
                   key=lambda r: (r["index"], r["sample"]))
        assert a == b
    # Samples differ (temperature 0.7, per-sample seeds) and the two settings decode differently.
    recs = read_records(workdir / "full" / "items" / "s1.jsonl")
    assert len({r["completion"] for r in recs}) > 6
    assert full["settings"]["s2"]["metrics"]["nfe_mean"] == 4 and full["settings"]["s1"]["metrics"]["nfe_mean"] == 8

    # A third run finds everything done and computes nothing.
    calls.clear()
    again = run_eval(_cfg(workdir, "resumed", **common), model=model, log=lambda m: None)
    assert calls == [] and _metrics(again) == _metrics(full)
    # A larger --limit later reuses the finished items; a different evaluation in the same dir is refused.
    with pytest.raises(ValueError, match="different evaluation .*seed"):
        run_eval(_cfg(workdir, "resumed", **{**common, "seed": 1}), model=model, log=lambda m: None)
    with pytest.raises(ValueError, match="setting 's1' was run with different decoding"):
        run_eval(_cfg(workdir, "resumed", **{**common, "setting": ["s1:tokens_per_step=2"]}),
                 model=model, log=lambda m: None)
    # Results decoded under another seed rule (the sha256 one of earlier versions) are not mixed with these.
    meta_file = workdir / "resumed" / "meta.json"
    meta = json.loads(meta_file.read_text())
    assert meta["seed_rule"] == "sample s of item i decodes with dllm_rl.seeding.derive_seed(seed, i, s)"
    meta["seed_rule"] = "sample s of item i decodes with sha256('dllm-rl-eval:{seed}:{i}:{s}')[:4] & 0x7fffffff"
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="different evaluation \\(seed_rule differs"):
        run_eval(_cfg(workdir, "resumed", **common), model=model, log=lambda m: None)


def test_block_model_cache_on_and_off_give_same_tokens(workdir):
    settings = ["cache:tokens_per_step=2", "nocache:tokens_per_step=2,block_cache=false"]
    cfg = _cfg(workdir, "sdar", model_dir=str(workdir / "sdar"), limit=3, setting=settings,
               decode={"gen_length": 8})
    summary = run_eval(cfg, log=lambda m: None)
    assert summary["settings"]["nocache"]["decode"]["block_cache"] is False
    a = _strip_time(read_records(workdir / "sdar" / "items" / "cache.jsonl"))
    b = _strip_time(read_records(workdir / "sdar" / "items" / "nocache.jsonl"))
    assert [(r["completion"], r["nfe"]) for r in a] == [(r["completion"], r["nfe"]) for r in b]
    assert summary["settings"]["cache"]["decode"]["steps"] == 2  # block_size 4, 2 tokens per step


def test_slots_decode_with_the_engine_to_the_same_records(workdir, monkeypatch):
    import dllm_rl.sampling.engine as engine_mod

    runs, real = [], engine_mod.Engine.run
    monkeypatch.setattr(engine_mod.Engine, "run",
                        lambda self, p, *rest: runs.append(len(p)) or real(self, p, *rest))
    settings = ["dyn:threshold=0.3,temperature=1.0",
                "nocache:block_cache=false,temperature=1.0"]
    common = dict(model_dir=str(workdir / "sdar"), limit=5, num_samples=2, setting=settings, decode={"gen_length": 8})
    fixed = run_eval(_cfg(workdir, "fixed_batches", **common), log=lambda m: None)
    engine = run_eval(_cfg(workdir, "slots", slots=3, batch_size=6, **common), log=lambda m: None)
    assert runs == [6, 4]  # the 10 samples of the cached setting, written 6 at a time; the uncached one: fixed
    assert _metrics(engine) == _metrics(fixed)
    for name in ("dyn", "nocache"):
        a = _strip_time(read_records(workdir / "slots" / "items" / f"{name}.jsonl"))
        b = _strip_time(read_records(workdir / "fixed_batches" / "items" / f"{name}.jsonl"))
        assert sorted(a, key=lambda r: (r["index"], r["sample"])) == sorted(b, key=lambda r: (r["index"], r["sample"]))
    assert len({r["nfe"] for r in a}) > 1


# ------------------------------------------------------------------------------------------ settings
def test_parse_settings_and_shortcuts(tmp_path):
    s = parse_setting("b8:block_length=8,cache=prefix")
    assert s == Setting("b8", {"block_length": "8", "cache": "prefix"})
    dc = resolve_decode({"gen_length": 64}, s).decode
    assert (dc.block_length, dc.cache, dc.gen_length) == (8, "prefix", 64)
    assert resolve_decode({}, parse_setting("x:tokens_per_step=2")).decode.steps == 16  # default block 32
    assert resolve_decode({}, parse_setting("x:tokens_per_step=3"), block_size=4).decode.steps == 2  # ceil(4/3)
    assert resolve_decode({"steps": 4}, parse_setting("base")).decode.steps == 4
    with pytest.raises(ValueError, match="did you mean 'threshold'"):
        resolve_decode({}, parse_setting("x:treshold=0.9"))
    with pytest.raises(ValueError, match=r"setting 'x': threshold: must be in \(0, 1\], got 1.5"):
        resolve_decode({}, parse_setting("x:threshold=1.5"))
    with pytest.raises(ValueError, match="block models"):
        resolve_decode({}, parse_setting("x:block_cache=false"))
    with pytest.raises(ValueError, match="key=value"):
        parse_setting("x:steps")
    with pytest.raises(ValueError, match="letters, digits"):
        parse_setting("a/b:steps=1")
    f = tmp_path / "s.yaml"
    f.write_text("static1: {tokens_per_step: 1}\ndyn: {threshold: 0.9}\n")
    assert load_settings_file(f) == [Setting("static1", {"tokens_per_step": 1}), Setting("dyn", {"threshold": 0.9})]
    f.write_text("- {name: a, steps: 2}\n- {name: b}\n")
    assert load_settings_file(f) == [Setting("a", {"steps": 2}), Setting("b", {})]


# ------------------------------------------------------------------------------------------ bad input
@pytest.fixture
def no_compute(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("compute started before the input was validated")

    monkeypatch.setattr(sampling, "generate", boom)
    monkeypatch.setattr(loading, "load_model", boom)
    import dllm_rl.models as models

    monkeypatch.setattr(models, "load_model", boom)


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"task": "gsm9k", "task_options": {}}, ValueError, "unknown task 'gsm9k'"),
        ({"task": "/nonexistent/x.jsonl"}, FileNotFoundError, "does not exist"),
        ({"data": "/nonexistent/x.jsonl", "task": "countdown", "task_options": {}}, FileNotFoundError, "x.jsonl"),
        ({"model_dir": "/nonexistent/model"}, FileNotFoundError, "model directory"),
        ({"model": "small_vocab"}, UserError, "embeds only 40.*do not belong together"),
        ({"model": "other_mask"}, ValueError, "mask token id 2 does not match the model's mask_token_id 5"),
        ({"setting": ["x:gen_length=0"]}, UserError, "setting .x.: gen_length: must be >= 1, got 0"),
        ({"num_samples": 0}, UserError, "^num_samples: must be >= 1, got 0$"),
    ],
)
def test_bad_input_fails_before_compute(workdir, no_compute, kw, exc, match):
    kw = dict(kw)
    if "model" in kw:
        kw["model_dir"] = str(workdir / kw.pop("model"))
    with pytest.raises(exc, match=match):
        run_eval(_cfg(workdir, "bad", **kw), log=lambda m: None)
    assert not (workdir / "bad" / "items").exists()


def test_too_long_for_the_context_fails_before_decoding(workdir, monkeypatch):
    model = loading.load_model(workdir / "llada")  # max_position_embeddings 1024

    def boom(*a, **k):
        raise AssertionError("decoding started")

    monkeypatch.setattr(sampling, "generate", boom)
    cfg = _cfg(workdir, "long", decode={"gen_length": 1024, "block_length": 8})
    with pytest.raises(ValueError, match="context is 1024"):
        run_eval(cfg, model=model, log=lambda m: None)
