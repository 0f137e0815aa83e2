"""Chat on every shipped demo model (its chat template renders the task's prompt), chat content parts with images
on the LLaDA-V and MMaDA demos (the answer `generate --image` gives), the local-file allow-list, and every
refusal a 400 naming the part."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import openai
import pytest
from big_images import zero_png
from serve_helpers import DEMO, running

from dllm_rl.cli import main
from dllm_rl.models import load_model, load_tokenizer
from dllm_rl.models.image_inputs import PromptEncoder
from dllm_rl.sampling import DecodeConfig, generate
from dllm_rl.serve.app import Server
from dllm_rl.serve.config import ServeConfig
from dllm_rl.serve.media import flatten
from dllm_rl.tasks import get_task
from dllm_rl.tasks.images import load_image

IMAGES = DEMO / "shapes_heldout_images"
#: each demo's decoding (its README's: greedy, one token per step) and the task its template renders
DEMOS = {"llada-countdown": (DecodeConfig(gen_length=16, block_length=16), "countdown"),
         "sdar-countdown": (DecodeConfig(gen_length=32), "countdown"),
         "llada_v-shapes": (DecodeConfig(gen_length=16, block_length=16), "shapes"),
         # 4 tokens a step: each of its steps computes logits over 126k rows (the published understanding ids)
         "mmada-shapes": (DecodeConfig(gen_length=16, block_length=16, steps=4), "shapes")}


def _task(task: str):
    """The demo's held-out task in its compact prompt style (the style the demos were trained on)."""
    name = "countdown_heldout.jsonl" if task == "countdown" else "shapes_heldout.jsonl"
    return get_task(task, data=str(DEMO / name), prompt_style="compact")


def _rows(task: str, n: int) -> list[dict]:
    return _task(task).load()[:n]


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _user(example: dict, task: str, url: str | None = None) -> list[dict]:
    """The chat request a user sends for ``example``: the countdown words, or the shapes query after its image."""
    if task == "countdown":
        return [{"role": "user", "content": f"nums {' '.join(map(str, example['nums']))} target {example['target']}"}]
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": example["query"]}]}]


@pytest.mark.parametrize("name", list(DEMOS))
def test_every_demo_chat_template_renders_its_task_prompt(name):
    decode, task_name = DEMOS[name]
    tok = load_tokenizer(DEMO / name)
    task = get_task(task_name, prompt_style="compact")
    for ex in _rows(task_name, 4):
        messages, urls = flatten(_user(ex, task_name, "data:image/png;base64,"), model_family(DEMO / name))
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert text == task.build_prompt(ex, tok) and len(urls) == (task_name == "shapes")
    # a trailing newline the user adds is not doubled
    assert tok.apply_chat_template([{"role": "user", "content": "nums 1 2 3 target 6\n"}], tokenize=False,
                                   add_generation_prompt=True) == "nums 1 2 3 target 6\n"


def model_family(path: Path) -> str:
    from dllm_rl.models.families import detect_family

    return detect_family(json.loads((path / "config.json").read_text())).name


def _library_answer(model, tok, ids, pim, decode, max_tokens) -> tuple[str, str]:
    """What the library gives the prompt alone under the request's seed, as the server words it."""
    roll = generate(model, ids, decode, seeds=[decode.seed], images=pim)
    answer = roll.completion_ids[0][roll.completion_mask[0]].tolist()
    ended = roll.finish_reason[0] == "eos"
    answer = answer[:-1] if ended else answer
    if len(answer) > max_tokens:
        answer, ended = answer[:max_tokens], False
    return tok.decode(answer, skip_special_tokens=True), "stop" if ended else "length"


@pytest.fixture(scope="module")
def demos():
    """name -> (model, tokenizer, encoder), loaded once."""
    out = {}
    for name in DEMOS:
        model = load_model(DEMO / name)
        tok = load_tokenizer(DEMO / name, mask_token_id=model.mask_token_id)
        out[name] = (model, tok, PromptEncoder(tok, DEMO / name))
    return out


def _server(demos, name, **limits) -> Server:
    model, tok, encoder = demos[name]
    return Server(model, tok, DEMOS[name][0], ServeConfig(**limits), name, encoder=encoder)


def _stream_text(client, body) -> tuple[str, str]:
    """The text and finish reason of a streamed chat through the official client (``stream_options`` asks for the
    usage chunk, which carries no choice)."""
    text, reason = "", None
    for chunk in client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reason = choice.finish_reason or reason
    return text, reason


@pytest.mark.parametrize("name", list(DEMOS))
def test_chat_plain_and_streamed_on_every_demo_answers_as_the_task_prompt(demos, name):
    """The chat answer is what the library gives the task's own prompt (with its image) under the same seed."""
    model, tok, encoder = demos[name]
    decode, task_name = DEMOS[name]
    task = _task(task_name)
    ex = task.load()[1]
    images = [task.images(ex)] if task_name == "shapes" else None
    ids, pim = encoder.encode(model, [task.build_prompt(ex, tok)], images)
    want = _library_answer(model, tok, ids, pim, decode, 16)
    url = _data_uri(IMAGES / Path(ex["image"]).name) if task_name == "shapes" else None
    body = {"model": name, "messages": _user(ex, task_name, url), "max_completion_tokens": 16}
    with running(_server(demos, name)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0)
        got = client.chat.completions.create(**body)
        assert got.usage.prompt_tokens == len(ids[0])
        streamed = _stream_text(client, body)
    answer = (got.choices[0].message.content, got.choices[0].finish_reason)
    assert answer == want and streamed == answer
    assert answer[0].startswith("<answer>")


@pytest.mark.parametrize("name", ["llada_v-shapes", "mmada-shapes"])
def test_chat_with_an_image_equals_generate_image(demos, name, capsys, tmp_path):
    """The same image as a data URI, a file: URL and a plain path under --allowed-local-media-path: one answer, the
    one `dllm-rl generate --image --chat` prints under the same seed."""
    ex = _rows("shapes", 4)[3]
    png = IMAGES / Path(ex["image"]).name
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "scene.png").write_bytes(png.read_bytes())
    steps = DEMOS[name][0].steps
    rc = main(["generate", str(DEMO / name), "--prompt", ex["query"], "--image", str(png), "--chat",
               "--gen-length", "16", "--block-length", "16", *(["--steps", str(steps)] if steps else [])])
    assert rc == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("<answer>")
    answers = []
    with running(_server(demos, name, allowed_local_media_path=str(tmp_path / "media"))) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0)
        for url in (_data_uri(png), f"file://{tmp_path / 'media' / 'scene.png'}", "scene.png"):
            got = client.chat.completions.create(model=name, messages=_user(ex, "shapes", url), max_tokens=16)
            answers.append(got.choices[0].message.content)
    assert answers == [printed] * 3


def _refused(client, content, param="messages") -> str:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}],
                                                  "max_tokens": 16})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    return r.json()["error"]["message"]


def test_every_image_refusal_is_a_400_naming_the_part(demos, tmp_path):
    png = IMAGES / "000000.png"
    (tmp_path / "media").mkdir()
    (tmp_path / "outside.png").write_bytes(png.read_bytes())
    (tmp_path / "media" / "link.png").symlink_to(tmp_path / "outside.png")

    def image(url):
        return {"type": "image_url", "image_url": {"url": url}}

    with running(_server(demos, "llada_v-shapes", allowed_local_media_path=str(tmp_path / "media"))) as base, \
            httpx.Client(base_url=base, timeout=60) as client:
        assert _refused(client, "<image>\ncolour circle").startswith(
            "messages[0].content: the text holds '<image>', which marks an image for a llada_v model, without an "
            "image; send the image as an image_url part")
        assert _refused(client, [image("data:image/png,abc")]).startswith(
            "messages[0].content[0]: image data URI 'data:image/png' is not base64")
        assert _refused(client, [image("data:image/png;base64,%%%")]).startswith(
            "messages[0].content[0]: image data URI has invalid base64")
        assert _refused(client, [image("data:image/png;base64," + base64.b64encode(b"not a png").decode())]) \
            .startswith("messages[0].content[0]: the embedded image is not a readable image")
        assert _refused(client, [image("data:text/plain;base64,aGk=")]).startswith(
            "messages[0].content[0]: 'data:text/plain;base64,aGk=' is not an image data URI")
        assert _refused(client, ["x"]) == ("messages[0].content[0]: a part of type 'str' is not taken; give 'text' or "
                                           "'image_url' parts")
        assert _refused(client, [{"type": "text", "text": "x"}, image("https://example.com/a.png")]).startswith(
            "messages[0].content[1]: 'https://example.com/a.png': http(s) URLs are not fetched")
        assert _refused(client, [image("ftp://host/a.png")]).startswith(
            "messages[0].content[0]: the URL scheme 'ftp' is not read")
        assert _refused(client, [image("link.png")]) == ("messages[0].content[0]: 'link.png' is outside the server's "
                                                         "--allowed-local-media-path folder")
        assert "is outside the server's --allowed-local-media-path" in _refused(
            client, [image(f"file://{tmp_path / 'outside.png'}")])
        assert _refused(client, [image("missing.png")]) == ("messages[0].content[0]: 'missing.png': no such file in "
                                                            "the server's --allowed-local-media-path folder")
        assert _refused(client, [{"type": "input_audio", "input_audio": {}}]).startswith(
            "messages[0].content[0]: a part of type 'input_audio' is not taken; give 'text' or 'image_url' parts")
        assert _refused(client, [{"type": "text"}]).startswith(
            "messages[0].content[0].text: a text part needs a string 'text'")
    with running(_server(demos, "llada_v-shapes")) as base, httpx.Client(base_url=base, timeout=60) as client:
        for (w, h), why in {(20000, 1): "its 20000 px side is over the limit of 16384 px",
                            (1, 40000): "its 40000 px side is over the limit of 16384 px",
                            (13000, 13000): "its 169,000,000 pixels are over the limit of 40,000,000"}.items():
            uri = "data:image/png;base64," + base64.b64encode(zero_png(w, h)).decode()  # 138 bytes to 20 KB
            said = _refused(client, [image(uri), {"type": "text", "text": "colour circle"}])
            assert said.startswith("messages[0].content[0]: ") and f"({w}x{h} px): {why}" in said, said
        assert _refused(client, [image(str(png))]).startswith(
            "messages[0].content[0]: local files are not read unless the server is started with "
            "--allowed-local-media-path DIR")
    with running(_server(demos, "mmada-shapes")) as base, httpx.Client(base_url=base, timeout=60) as client:
        two = [image(_data_uri(png)), image(_data_uri(png)), {"type": "text", "text": "colour circle"}]
        assert _refused(client, two) == "messages: 2 images, but a mmada model takes at most 1 per prompt"
    with running(_server(demos, "sdar-countdown")) as base, httpx.Client(base_url=base, timeout=60) as client:
        assert _refused(client, [image(_data_uri(png))]).startswith(
            "messages[0].content[0]: an image for a sdar model, which reads text only")
        # text parts on a text model are joined as text; '<image>' is text there
        parts = [{"type": "text", "text": "nums 6 2 1"}, {"type": "text", "text": "target 14"}]
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}]})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len("nums 6 2 1\ntarget 14\n")


def test_generate_image_refusals_are_one_line(capsys):
    png = str(IMAGES / "000000.png")
    cases = [
        (["sdar-countdown", "--prompt", "x", "--image", png],
         "--image was given, but a sdar model reads text only"),
        (["llada_v-shapes", "--prompt", "<image> a", "--prompt", "b", "--image", png, "--image", png],
         "--prompt texts hold 1 <image> placeholder(s) but 2 --image file(s) were given"),
        (["mmada-shapes", "--prompt", "x", "--image", png, "--image", png],
         "--image: a prompt has 2 images, but a mmada model takes at most 1 per prompt"),
        (["llada_v-shapes", "--prompt", "x", "--image", "nowhere.png"], "--image nowhere.png: image file"),
        (["llada-countdown", "--prompt", "x", "--chat-template", "t.jinja"],
         "--chat-template FILE is the template of --chat; add --chat"),
        (["llada-countdown", "--prompt", "x", "--chat", "--chat-template", "nowhere.jinja"],
         "--chat-template nowhere.jinja: no such file"),
    ]
    for args, says in cases:
        assert main(["generate", str(DEMO / args[0]), *args[1:]]) == 2, args
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, (args, err)


def test_a_chat_template_file_serves_a_model_without_one(demos, tmp_path):
    """--chat-template FILE (serve's build_server): the file's template renders the chat; a broken one stops the
    start with one line."""
    from dllm_rl.errors import UserError
    from dllm_rl.serve.cli import build_server

    (tmp_path / "t.jinja").write_text("{% for m in messages %}Q {{ m['content'] }}\n{% endfor %}")
    server = build_server(str(DEMO / "llada-countdown"), DEMOS["llada-countdown"][0], ServeConfig(),
                          chat_template=str(tmp_path / "t.jinja"))
    with running(server) as base, httpx.Client(base_url=base, timeout=60) as client:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len("Q hi\n")
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}")
    with pytest.raises(UserError, match=r"^--chat-template .*bad.jinja: not a Jinja template \(line 1: "):
        build_server(str(DEMO / "llada-countdown"), DEMOS["llada-countdown"][0], ServeConfig(),
                     chat_template=str(tmp_path / "bad.jinja"))


def test_image_loader_is_the_tasks_one_with_its_limits(tmp_path):
    """A data URI over the task's image limit is refused before it is decoded, with the tasks' message."""
    from dllm_rl.serve.media import MediaError, fetch_image
    from dllm_rl.tasks.image_limits import ImageLimits

    uri = _data_uri(IMAGES / "000000.png")
    assert fetch_image(uri, "here").size == load_image(IMAGES / "000000.png").size
    with pytest.raises(MediaError, match=r"^here: the embedded image \(0.0 MiB\): over the limit of 1e-05 MiB"):
        fetch_image(uri, "here", limits=ImageLimits(max_file_mb=0.00001))
