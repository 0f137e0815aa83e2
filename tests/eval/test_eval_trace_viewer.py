"""The trace viewer: a self-contained page, replayed in a real headless Chromium (DOM asserts + screenshot)."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from dllm_rl.eval.trace_viewer import TraceRecord, load_trace_jsonl, normalize_trace, render_html, write_html
from dllm_rl.eval.trace_viewer.browser import Chromium, find_chromium

# Completion "12</script>ok" + EOS + padding; steps: 2 tokens at step 0, then one per step, EOS at 9,
# one padding position never committed.
TOKENS = ["1", "2", "</script>", "o", "k", "<eos>", "<eos>", "<eos>"]
STEP_MAP = [0, 0, 1, 2, 3, 4, 4, -1]
CONF = [0.91, 0.87, 0.5, 0.66, 0.7, 0.99, 0.98, None]
HIGHLIGHT = np.array([255, 176, 0]) / 255.0  # .tok.new background (#ffb000)


def _record(**kw) -> TraceRecord:
    base = dict(prompt_tokens=list("7+5="), tokens=TOKENS, step_map=STEP_MAP, confidence=CONF, answer_length=6,
                nfe=5, text="12</script>ok", label="first", block_length=4)
    base.update(kw)
    return TraceRecord(**base)


def test_record_defaults_and_validation():
    r = _record()
    assert r.num_steps == 5  # max step 4 -> steps 0..4
    with pytest.raises(ValueError, match="8 tokens but 3 step_map"):
        _record(step_map=[0, 1, 2])


def test_normalize_trace_from_ids_and_strings():
    class Tok:  # a stand-in tokenizer: id -> character
        def decode(self, ids, **kw):
            return "".join(chr(ord("a") + i) for i in ids)

    rec = normalize_trace({"prompt_ids": [0, 1], "completion_ids": [2, 3, 4], "step_map": [1, 0, -1],
                           "completion_mask": [1, 1, 0], "nfe": 2, "text": "cd"}, tokenizer=Tok())
    assert rec.prompt_tokens == ["a", "b"] and rec.tokens == ["c", "d", "e"]
    assert rec.answer_length == 2 and rec.num_steps == 2 and rec.token_ids == [2, 3, 4]
    with pytest.raises(ValueError, match="pass a tokenizer"):
        normalize_trace({"completion_ids": [1], "step_map": [0]})
    with pytest.raises(ValueError, match="no step_map"):
        normalize_trace({"tokens": ["a"]})


def test_load_trace_jsonl_names_bad_line(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"tokens": ["a"], "step_map": [0]}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"t.jsonl:2: invalid JSON: Expecting property name"):
        load_trace_jsonl(f)


def test_page_is_self_contained_and_escapes_data():
    page = render_html([_record()], meta={"model": "tiny"})
    # No network resources of any kind: no external scripts, styles, images, fonts or links.
    assert not re.search(r"""(src|href)\s*=""", page)
    assert "http://" not in page and "https://" not in page and "@import" not in page and "url(" not in page
    # The token "</script>" is data, and cannot close the data element early.
    data = page.split('<script id="trace-data" type="application/json">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data)["records"][0]["tokens"][2] == "</script>"


def _pixels(png: bytes) -> np.ndarray:
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3]


def _count_color(img: np.ndarray, rgb: np.ndarray, tol: float = 0.03) -> int:
    return int((np.abs(img - rgb).max(axis=-1) < tol).sum())


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        pytest.skip("no Chromium found: install it with `apt-get install -y chromium` (`make sysdeps` does this "
                    "as root) or point $CHROMIUM at a Chrome/Chromium binary")
    with Chromium(width=1000, height=600) as b:
        yield b


@pytest.mark.browser
def test_viewer_replays_decoding_in_headless_chromium(browser, tmp_path):
    second = _record(tokens=["x", "y", "<eos>", "<eos>"], step_map=[1, 0, 2, 2], confidence=None, label="second",
                     answer_length=3, text="xy", block_length=None)
    page = tmp_path / "trace.html"
    html = render_html([_record(), second], meta={"model": "tiny"}, interval_ms=20)
    page.write_text(html, encoding="utf-8")
    browser.goto(page.as_uri())
    js = browser.evaluate
    assert js("document.body.dataset.ready") == "true"
    # Before step 0 every generated position is masked; the prompt is shown.
    assert js("document.querySelectorAll('#seq .tok.gen.masked').length") == 8
    assert js("[...document.querySelectorAll('#seq .tok.prompt')].map(e => e.textContent).join('')") == "7+5="
    # Block boundaries every 4 completion positions (block_length 4): one separator between 8 positions.
    assert js("document.querySelectorAll('#seq .block-sep').length") == 1
    assert js("document.getElementById('step-label').textContent").startswith("before step 0")
    before = _pixels(browser.screenshot(selector="#seq"))  # the sequence only, not the legend
    assert _count_color(before, HIGHLIGHT) == 0

    # Move the slider with real input: click it (focus) then press Home and ArrowRight three times.
    browser.click("#slider")
    browser.press_key("Home")
    assert js("document.body.dataset.step") == "-1"
    for _ in range(3):
        browser.press_key("ArrowRight")
    assert js("document.getElementById('slider').value") == "2"
    assert js("document.body.dataset.step") == "2"
    committed = js("[...document.querySelectorAll('#seq .tok.gen.committed')].map(e => Number(e.dataset.idx))")
    assert committed == [0, 1, 2, 3]  # step_map <= 2
    fresh = js("[...document.querySelectorAll('#seq .tok.gen.new')].map(e => [e.dataset.idx, e.textContent])")
    assert fresh == [["3", "o"]]
    assert js("document.querySelectorAll('#seq .tok.gen.masked').length") == 4
    assert js("[...document.querySelectorAll('#seq .tok.gen.committed')].map(e => e.textContent).join('')") == (
        "12</script>o")
    assert js("document.getElementById('step-label').textContent").startswith("step 2 / 4")
    # Hover: the step number and the confidence at commit.
    title = js("document.querySelector('#seq .tok.gen.new').title")
    assert title.startswith("step 2 | confidence 0.6600")
    browser.hover("#seq .tok.gen.new")
    assert js("getComputedStyle(document.getElementById('tooltip')).display") == "block"
    assert "step 2 | confidence 0.6600" in js("document.getElementById('tooltip').textContent")
    # The screenshot shows the token committed at this step highlighted, and earlier ones in green.
    shot = tmp_path / "step2.png"
    img = _pixels(browser.screenshot(shot, selector="#seq"))
    assert shot.stat().st_size > 1000
    assert _count_color(img, HIGHLIGHT) > 50
    green = np.array([0xDA, 0xFB, 0xE1]) / 255.0  # .tok.committed background
    assert _count_color(img, green) > 50 and _count_color(before, green) == 0

    # The previous-step button and the play button.
    browser.click("#prev")
    assert js("document.body.dataset.step") == "1"
    browser.click("#play")
    assert js("document.body.dataset.playing") == "true"
    js("new Promise(r => { const t = setInterval(() => { if (document.body.dataset.playing === 'false')"
       " { clearInterval(t); r(true); } }, 10); })")
    assert js("document.body.dataset.step") == "4"
    assert js("document.querySelectorAll('#seq .tok.gen.committed').length") == 7
    never = js("[...document.querySelectorAll('#seq .tok.gen.never')].map(e => e.dataset.idx)")
    assert never == ["7"]
    assert "never committed" in js("document.querySelector('#seq .tok.gen.never').title")

    # Switch to the second sequence: its own tokens and steps; confidence shown as n/a.
    js("(() => { const s = document.getElementById('record'); s.value = '1';"
       " s.dispatchEvent(new Event('change')); })()")
    assert js("document.querySelectorAll('#seq .tok.gen').length") == 4
    js("(() => { const s = document.getElementById('slider'); s.value = '0';"
       " s.dispatchEvent(new Event('input')); })()")
    assert js("[...document.querySelectorAll('#seq .tok.gen.new')].map(e => e.textContent)") == ["y"]
    assert "confidence n/a" in js("document.querySelector('#seq .tok.gen.new').title")


@pytest.mark.browser
def test_write_html_then_screenshot_helper(browser, tmp_path):
    from dllm_rl.eval.trace_viewer.browser import screenshot_file

    path = write_html(tmp_path / "sub" / "t.html", [_record()])
    png = screenshot_file(path, tmp_path / "t.png", step=0, width=800, height=400)
    img = _pixels(png.read_bytes())
    assert img.shape[:2] == (400, 800)
    legend_only = _count_color(_pixels(screenshot_file(path, tmp_path / "t0.png", step=-1, width=800, height=400)
                                       .read_bytes()), HIGHLIGHT)
    assert _count_color(img, HIGHLIGHT) > legend_only + 50  # step 0 commits "1" and "2"


@pytest.mark.browser
def test_viewer_replays_a_real_rollout(browser, tmp_path):
    """A block model's real decode: at every slider step the page shows exactly the rollout's commits."""
    from dllm_rl.eval.trace_viewer import records_from_rollout
    from dllm_rl.models import build_model, char_tokenizer, tiny_config
    from dllm_rl.sampling import DecodeConfig, generate

    tok = char_tokenizer()
    cfg = tiny_config("sdar", vocab_size=len(tok), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = build_model("sdar", cfg, seed=3)
    prompts = [tok.encode("nums 3 4 5 target 7\n"), tok.encode("hi")]
    roll = generate(model, prompts, DecodeConfig(gen_length=8, threshold=0.5), tokenizer=tok)
    recs = records_from_rollout(roll, tok, block_length=4, block_offsets=[len(p) for p in prompts])
    path = write_html(tmp_path / "real.html", recs)
    browser.goto(path.as_uri())
    js = browser.evaluate
    step_map = roll.step_map[0].tolist()
    width = js("document.querySelectorAll('#seq .tok.gen').length")
    assert width == len(step_map)
    # A boundary where absolute position (prompt length + j) is a multiple of 4, after the first slot.
    assert js("document.querySelectorAll('#seq .block-sep').length") == sum(
        1 for j in range(1, width) if (len(prompts[0]) + j) % 4 == 0)
    browser.click("#slider")
    browser.press_key("Home")
    for k in range(int(roll.nfe[0])):
        browser.press_key("ArrowRight")
        assert js("document.body.dataset.step") == str(k)
        fresh = js("[...document.querySelectorAll('#seq .tok.gen.new')].map(e => Number(e.dataset.idx))")
        assert fresh == [j for j, s in enumerate(step_map) if s == k]
        assert int(js("document.body.dataset.committed")) == sum(0 <= s <= k for s in step_map)
    ids = roll.completion_ids[0].tolist()
    shown = js("[...document.querySelectorAll('#seq .tok.gen')].map(e => e.textContent)")
    def display(i: int) -> str:  # the page shows spaces, newlines and tabs visibly
        return tok.decode([i]).replace(" ", "\u00a0").replace("\n", "\u21b5").replace("\t", "\u21e5")

    assert [t for t, s in zip(shown, step_map) if s >= 0] == [display(i) for i, s in zip(ids, step_map) if s >= 0]


def test_non_finite_values_are_strict_json_and_a_null_step_is_refused(tmp_path):
    """NaN / Infinity used to be written as bare NaN (JSON.parse fails: a blank page) and a null step was a
    TypeError: the page's data is strict JSON with non-finite values as strings, and a bad step names the line."""
    page = render_html([_record(confidence=[float("nan"), float("inf"), float("-inf")] + CONF[3:],
                                reward=float("nan"))], meta={"threshold": float("inf")})
    data = page.split('<script id="trace-data" type="application/json">', 1)[1].split("</script>", 1)[0]

    def strict(const):
        raise AssertionError(f"bare {const} in the page's JSON")

    payload = json.loads(data.replace("\\u003c", "<"), parse_constant=strict)
    rec = payload["records"][0]
    assert rec["confidence"][:4] == ["NaN", "Infinity", "-Infinity", 0.66] and rec["reward"] == "NaN"
    assert payload["meta"]["threshold"] == "Infinity"
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"tokens": ["a", "b"], "step_map": [0, 1]}) + "\n"
                 + json.dumps({"tokens": ["a", "b", "c"], "steps": [0, None, 1.5]}) + "\n")
    with pytest.raises(ValueError, match=r"^.*t.jsonl:2: step_map\[1\] is null; every position needs the integer "
                                         r"step at which its token was committed \(-1: never\)$"):
        load_trace_jsonl(f)
    with pytest.raises(ValueError, match=r"step_map\[2\] is 1.5;"):
        _record(tokens=["a", "b", "c"], step_map=[0, 1, 1.5], confidence=None)
    assert _record(step_map=[0.0, 0, 1, 2, 3, 4, 4, -1]).step_map[0] == 0  # an integral float is a step


@pytest.mark.browser
def test_viewer_shows_non_finite_values(browser, tmp_path):
    page = tmp_path / "nan.html"
    conf = [float("nan"), float("inf")] + CONF[2:]
    page.write_text(render_html([_record(confidence=conf, reward=float("nan"))]), encoding="utf-8")
    browser.goto(page.as_uri())
    js = browser.evaluate
    assert js("document.body.dataset.ready") == "true"
    titles = js("[...document.querySelectorAll('#seq .tok.gen')].map(e => e.title)")
    assert titles[0].startswith("step 0 | confidence NaN") and titles[1].startswith("step 0 | confidence Infinity")
    assert js("document.getElementById('stats').textContent").endswith("| reward NaN")
