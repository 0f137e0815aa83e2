"""The synthetic shapes task: exact rows from a seed, answers recomputed from the drawing parameters and from the
pixels of the drawn images, the rare-pair split, `dllm-rl data make shapes`, prompts and rewards."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from data_cli import read_rows, run_cli
from PIL import Image

from dllm_rl.errors import UserError
from dllm_rl.tasks import get_task
from dllm_rl.tasks.shapes import COLOURS, RARE_PAIRS, draw_scene, make_shapes, make_shapes_pair, row_key

ROW_WORDS, COL_WORDS = ("top", "middle", "bottom"), ("left", "center", "right")


def answer_of(query: str, objects: list[dict]) -> str | None:
    """The answer to a compact query over (shape, colour, row, col) objects, by the task's stated rules."""
    kind, *words = query.split()
    if kind == "count":
        colour, shape = words
        return str(sum(o["shape"] == shape and o["colour"] == colour for o in objects))
    if kind == "colour":
        (hit,) = [o for o in objects if o["shape"] == words[0]]  # exactly one such shape
        return hit["colour"]
    colour, shape = words
    (hit,) = [o for o in objects if o["shape"] == shape and o["colour"] == colour]
    return f"{ROW_WORDS[hit['row']]} {COL_WORDS[hit['col']]}"


def objects_in_pixels(img: Image.Image) -> list[dict]:
    """The shapes an image shows, read from its pixels alone: per grid cell, the one palette colour its
    non-white pixels have, and the shape from their count against the filled box (square: all of it; circle:
    about pi/4; triangle: about 1/2)."""
    px = np.asarray(img)
    size = px.shape[0]
    cell, m = size // 3, max(1, size // 3 // 8)
    side = cell - 2 * m
    palette = {v: k for k, v in COLOURS.items()}
    found = []
    for r in range(3):
        for c in range(3):
            block = px[r * cell:(r + 1) * cell, c * cell:(c + 1) * cell].reshape(-1, 3)
            ink = block[(block != 255).any(axis=1)]
            if not len(ink):
                continue
            colours = {tuple(int(v) for v in p) for p in ink}
            assert len(colours) == 1, colours  # flat fill, no anti-aliasing
            fill = len(ink) / side**2
            shape = "square" if len(ink) == side**2 else "triangle" if fill < 0.62 else "circle"
            assert shape != "circle" or 0.7 < fill < 0.85, fill
            found.append({"shape": shape, "colour": palette[colours.pop()], "row": r, "col": c})
    return found


def test_rows_from_a_seed_are_exact_and_reproducible():
    rows = make_shapes(3, seed=0)
    assert rows[0] == {
        "question": "Where is the red square? Give its row (top, middle or bottom) and column (left, center or "
                    "right).",
        "query": "where red square", "answer": "middle left", "kind": "where",
        "objects": [{"shape": "square", "colour": "red", "row": 1, "col": 0}], "size": 48}
    assert rows[2] == {
        "question": "What colour is the square?", "query": "colour square", "answer": "green", "kind": "colour",
        "objects": [{"shape": "circle", "colour": "yellow", "row": 1, "col": 0},
                    {"shape": "square", "colour": "green", "row": 1, "col": 1},
                    {"shape": "circle", "colour": "green", "row": 1, "col": 2},
                    {"shape": "circle", "colour": "red", "row": 2, "col": 1}], "size": 48}
    assert make_shapes(3, seed=0) == rows and make_shapes(3, seed=1) != rows
    assert make_shapes(3, seed=0, split="test") != rows


@pytest.mark.parametrize("size", [32, 48, 64])
def test_answers_match_the_drawing_parameters_and_the_pixels(size):
    rows = make_shapes(150, seed=3, size=size, max_objects=6)
    assert len({row_key(r) for r in rows}) == 150
    assert Counter(r["kind"] for r in rows).keys() == {"count", "colour", "where"}
    assert {r["answer"] for r in rows if r["kind"] == "count"} >= {"0", "1", "2"}
    for r in rows:
        assert r["answer"] == answer_of(r["query"], r["objects"]), r
        img = draw_scene(r["objects"], size)
        assert img.size == (size, size) and img.mode == "RGB"
        seen = objects_in_pixels(img)
        assert seen == sorted(r["objects"], key=lambda o: (o["row"], o["col"]))
        assert answer_of(r["query"], seen) == r["answer"]
    red_square_px = (np.asarray(draw_scene([{"shape": "square", "colour": "red", "row": 0, "col": 0}], 48))
                     == COLOURS["red"]).all(axis=-1).sum()
    assert red_square_px == 12 * 12  # 16 px cell, 2 px margin


def test_rare_split_asks_about_pairs_rare_in_training_and_shares_no_row():
    train, test = make_shapes_pair(1000, 100, seed=0)
    keys = {row_key(r) for r in train}
    assert len(keys) == 1000 and not keys & {row_key(r) for r in test}

    def pair(query):
        return tuple(query.split()[::-1][:2]) if not query.startswith("colour") else None

    for r in test:
        asked = [o for o in r["objects"] if (o["shape"], o["colour"]) in RARE_PAIRS]
        assert asked, r
        if r["kind"] != "colour":
            assert pair(r["query"]) in RARE_PAIRS, r["query"]
        else:
            assert (r["query"].split()[1], r["answer"]) in RARE_PAIRS
    rare_objects = sum((o["shape"], o["colour"]) in RARE_PAIRS for r in train for o in r["objects"])
    all_objects = sum(len(r["objects"]) for r in train)
    # 3 of 12 pairs at weight 0.05: 0.15 / 9.15 = 1.6% of the training shapes are rare pairs
    assert 0.008 < rare_objects / all_objects < 0.025, (rare_objects, all_objects)


def test_make_shapes_writes_pngs_next_to_the_jsonl_and_the_task_reads_them(tmp_path):
    out, rare = tmp_path / "data" / "shapes.jsonl", tmp_path / "data" / "rare.jsonl"
    out.parent.mkdir()
    assert run_cli("data", "make", "shapes", "--n", "40", "--seed", "2", "--out", str(out), "--test-out",
                   str(rare), "--test-n", "10", "--image-size", "32", "--max-objects", "3") == 0
    rows = read_rows(out)
    assert len(rows) == 40 and rows[0]["image"] == "shapes_images/000000.png"
    assert sorted(p.name for p in (tmp_path / "data" / "shapes_images").iterdir())[-1] == "000039.png"
    assert len(list((tmp_path / "data" / "rare_images").iterdir())) == 10
    train, test = make_shapes_pair(40, 10, seed=2, size=32, max_objects=3)
    assert [{k: v for k, v in r.items() if k != "image"} for r in rows] == train
    task = get_task(str(out), task_type="shapes", prompt_style="compact")
    ex = task.examples[0]
    assert ex["prompt"] == f"<image>\n{train[0]['query']}\n"
    img = task.images(ex)[0]
    assert img.tobytes() == draw_scene(train[0]["objects"], 32).tobytes()
    assert objects_in_pixels(img) == train[0]["objects"]
    refs = [task.reference_completion(e) for e in task.examples]
    assert [float(s) for s in task.score_examples(refs, task.examples)] == [1.0] * 40
    with pytest.raises(UserError, match=r"^shapes --image-size must be in 32..96 px, got 20$"):
        run_cli("data", "make", "shapes", "--n", "1", "--out", str(tmp_path / "x.jsonl"), "--image-size", "20")
    with pytest.raises(UserError, match=r"^shapes --questions: unknown kind size; choose from count, colour, where$"):
        run_cli("data", "make", "shapes", "--n", "1", "--out", str(tmp_path / "x.jsonl"), "--questions", "count,size")


def test_prompts_and_rewards():
    objects = [{"shape": "triangle", "colour": "green", "row": 0, "col": 0},
               {"shape": "circle", "colour": "red", "row": 1, "col": 1},
               {"shape": "circle", "colour": "red", "row": 2, "col": 2}]
    img = draw_scene(objects, 48)
    rows = [{"image": img, "kind": "count", "query": "count red circle", "answer": "2",
             "question": "How many red circles are in the image?"},
            {"image": img, "kind": "where", "query": "where green triangle", "answer": "top left",
             "question": "Where is the green triangle?"},
            {"image": img, "kind": "colour", "query": "colour triangle", "answer": "green",
             "question": "What colour is the triangle?"}]
    chat = get_task("shapes", data=rows)
    assert chat.examples[0]["prompt"] == ("<image>\nHow many red circles are in the image? Give only the answer "
                                          "inside <answer> </answer> tags, for example <answer>3</answer>.")
    assert chat.examples[1]["prompt"].endswith("for example <answer>top left</answer>.")
    count, where, colour = chat.examples
    cases = [(count, "<answer>2</answer>", 1.0, "correct: 2"), (count, "<answer> 2. </answer>", 1.0, "correct: 2"),
             (count, "<answer>3</answer>", 0.0, "wrong: got '3', expected '2'"),
             (count, "2", 0.0, "no <answer>...</answer>"),
             (where, "<answer>Top-Left</answer>", 1.0, "correct: top left"),
             (where, "<answer>left top</answer>", 1.0, "correct: top left"),
             (where, "<answer>top center</answer>", 0.0, "wrong: got 'top center', expected 'top left'"),
             (colour, "<answer>Green.</answer>", 1.0, "correct: green"),
             (colour, "<answer>red</answer>", 0.0, "wrong: got 'red', expected 'green'")]
    for ex, text, value, reason in cases:
        s = chat.score_one(text, ex)
        assert (float(s), s.reason) == (value, reason), text
    lenient = get_task("shapes", data=rows, strict=False)
    assert lenient.score_one("I count them.\n2", lenient.examples[0]) == 1.0
