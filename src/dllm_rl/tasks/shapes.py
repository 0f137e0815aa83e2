"""Shapes: a synthetic visual task, small images of coloured shapes with exact answers (``dllm-rl data make shapes``).

A scene is a 3x3 grid of cells on a white square image (``size`` px, 32 to 96, default 48); 1 to
``max_objects`` cells hold one shape each: a ``circle``, ``square`` or ``triangle`` in ``red``, ``green``,
``blue`` or ``yellow`` (flat RGB colours from :data:`COLOURS`, drawn by Pillow without anti-aliasing, so every
pixel of a shape has its exact colour and shapes never touch). A row asks one question about the scene:

- ``count``: "How many red circles are in the image?" -> ``2`` (may be ``0``);
- ``colour``: "What colour is the square?" (the scene has exactly one square) -> ``blue``;
- ``where``: "Where is the green triangle?" (exactly one) -> ``top left`` (row ``top|middle|bottom``, column
  ``left|center|right``).

Rows: ``{"image": "NAME_images/000000.png", "question", "query", "kind", "answer", "objects": [{"shape",
"colour", "row", "col"}, ...], "size"}``. The images are PNG files in a folder next to the JSONL file (``NAME``
is the file name without its suffixes) and ``image`` is the path relative to the JSONL file's folder, so the
pair can be moved together and the images opened with any viewer.

Prompt styles (the ``<image>`` line first, as LLaDA-V's prompts place it):

- ``compact`` (tiny models): ``"<image>\\ncount red circle\\n"`` -> completion ``"<answer>2</answer>"``;
- ``chat`` / ``plain``: the English question and an instruction to answer inside ``<answer> </answer>``.

Reward: 1.0 when the last ``<answer>...</answer>`` (``strict=False``: else the last non-empty line) equals the
answer: an integer for ``count``, the colour word for ``colour``, the two position words in either order
(``top-left`` = ``left top``) for ``where``; case, spaces and a final ``.`` are ignored.

Rare split: the three pairs of :data:`RARE_PAIRS` (blue circle, yellow square, green triangle) are drawn
``rare_weight`` (default 0.05) times as often as the other nine pairs in the ``train`` and ``test`` streams. The
``rare`` stream (``--test-out`` of ``dllm-rl data make shapes``) asks only about a rare-pair shape: a held-out set
of shapes the training set rarely shows, made first and excluded from the training set (no row in common).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from PIL import Image, ImageDraw

from dllm_rl.errors import UserError

from .arith import parse_int
from .base import Score, read_rows
from .extract import tagged
from .image_task import ImageTask
from .synthetic import _collect, _rng

SHAPES = ("circle", "square", "triangle")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30), "green": (20, 160, 40), "blue": (30, 70, 230), "yellow": (240, 200, 0)}
BACKGROUND = (255, 255, 255)
ROWS = ("top", "middle", "bottom")
COLS = ("left", "center", "right")
KINDS = ("count", "colour", "where")
RARE_PAIRS = (("circle", "blue"), ("square", "yellow"), ("triangle", "green"))
PAIRS = tuple((s, c) for s in SHAPES for c in COLOURS)
DIFFICULTY = {"easy": {"max_objects": 2}, "medium": {"max_objects": 4}, "hard": {"max_objects": 6}}
_EXAMPLE = {"count": "3", "colour": "red", "where": "top left"}


# ------------------------------------------------------------------------------------------------ drawing
def shape_box(row: int, col: int, size: int) -> tuple[int, int, int, int]:
    """The inclusive pixel box ``(x0, y0, x1, y1)`` a shape fills in grid cell (row, col): the cell (``size // 3``
    px) less a margin of ``cell // 8`` px on each side."""
    cell = size // 3
    m = max(1, cell // 8)
    return col * cell + m, row * cell + m, (col + 1) * cell - 1 - m, (row + 1) * cell - 1 - m


def draw_scene(objects: Iterable[Mapping[str, Any]], size: int) -> Image.Image:
    """The RGB image of a scene: each object's shape filled with its colour inside its :func:`shape_box`."""
    img = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for o in objects:
        x0, y0, x1, y1 = shape_box(o["row"], o["col"], size)
        fill = COLOURS[o["colour"]]
        if o["shape"] == "square":
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        elif o["shape"] == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        else:  # triangle, apex up
            draw.polygon([(x0, y1), (x1, y1), ((x0 + x1) / 2, y0)], fill=fill)
    return img


# ------------------------------------------------------------------------------------------------ questions
def position(obj: Mapping[str, Any]) -> str:
    """``"top left"`` ... ``"bottom right"``: the object's grid row and column words."""
    return f"{ROWS[obj['row']]} {COLS[obj['col']]}"


def question_for(kind: str, obj: Mapping[str, Any], objects: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """``question``, ``query`` and ``answer`` of a ``kind`` question about ``obj`` in ``objects`` (for ``count``,
    ``obj`` only names the shape and colour), or None when the question would be ambiguous (``colour``: more
    than one shape of that kind; ``where``: more than one of that shape and colour)."""
    shape, colour = obj["shape"], obj["colour"]
    same_shape = [o for o in objects if o["shape"] == shape]
    same_pair = [o for o in same_shape if o["colour"] == colour]
    if kind == "count":
        return {"question": f"How many {colour} {shape}s are in the image?", "query": f"count {colour} {shape}",
                "answer": str(len(same_pair))}
    if kind == "colour":
        if len(same_shape) != 1:
            return None
        return {"question": f"What colour is the {shape}?", "query": f"colour {shape}", "answer": colour}
    if kind == "where":
        if len(same_pair) != 1:
            return None
        return {"question": f"Where is the {colour} {shape}? Give its row (top, middle or bottom) and column (left, "
                            "center or right).", "query": f"where {colour} {shape}", "answer": position(same_pair[0])}
    raise UserError(f"unknown shapes question kind {kind!r}; choose from {', '.join(KINDS)}")


def random_row(rng: random.Random, *, size: int, min_objects: int, max_objects: int, kinds: Sequence[str],
               rare_weight: float, rare: bool) -> dict[str, Any] | None:
    """One row: a random scene and a question about it (see the module docstring); None when no shape of the
    scene fits the drawn question unambiguously (the caller draws again). ``rare``: one shape is a rare pair and
    the question is about it."""
    weights = [rare_weight if p in RARE_PAIRS else 1.0 for p in PAIRS]
    n = rng.randint(min_objects, max_objects)
    cells = sorted(rng.sample(range(9), n))
    pairs = rng.choices(PAIRS, weights, k=n)
    if rare:
        pairs[rng.randrange(n)] = rng.choice(RARE_PAIRS)
    objects = [{"shape": s, "colour": c, "row": cell // 3, "col": cell % 3} for cell, (s, c) in zip(cells, pairs)]
    kind = rng.choice(list(kinds))
    if kind == "count" and not rare and rng.random() < 0.25:  # a pair drawn afresh: may be absent (answer 0)
        s, c = rng.choices(PAIRS, weights)[0]
        target: Mapping[str, Any] = {"shape": s, "colour": c}
    else:
        eligible = [o for o in objects if question_for(kind, o, objects) is not None
                    and (not rare or (o["shape"], o["colour"]) in RARE_PAIRS)]
        if not eligible:
            return None
        target = rng.choice(eligible)
    return {**(question_for(kind, target, objects) or {}), "kind": kind, "objects": objects, "size": size}


def row_key(row: Mapping[str, Any]) -> str:
    """Identity of a row for deduplication and train/test disjointness: the scene, the image size and the
    question."""
    objs = sorted((o["row"], o["col"], o["shape"], o["colour"]) for o in row["objects"])
    return json.dumps([int(row.get("size", 48)), objs, row["query"]])


def keys_of(paths: Iterable[str | Path]) -> set[str]:
    """The :func:`row_key` of every row in the given files (for ``exclude``)."""
    return {row_key(row) for p in paths for _, row in read_rows(p)}


def make_shapes(n: int, seed: int = 0, *, size: int = 48, min_objects: int = 1, max_objects: int = 4,
                kinds: Sequence[str] = KINDS, rare_weight: float = 0.05, split: str = "train",
                exclude: Iterable[str] = ()) -> list[dict[str, Any]]:
    """``n`` distinct rows (no ``image`` yet: :func:`write_shapes` draws them); ``split`` ``train`` / ``test`` /
    ``rare`` picks the random stream, ``rare`` also the rare-pair questions. Rows depend only on the arguments."""
    if not 32 <= size <= 96:
        raise UserError(f"shapes --image-size must be in 32..96 px, got {size}")
    if not 1 <= min_objects <= max_objects <= 9:
        raise UserError(f"shapes needs 1 <= --min-objects <= --max-objects <= 9, got {min_objects} and {max_objects}")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise UserError(f"shapes --questions: unknown kind {', '.join(bad) or '(none)'}; choose from "
                        f"{', '.join(KINDS)}")
    if not 0 < rare_weight <= 1:
        raise UserError(f"shapes --rare-weight must be in (0, 1], got {rare_weight}")
    rng = _rng("shapes", split, seed)
    opts = {"size": size, "min_objects": min_objects, "max_objects": max_objects, "kinds": tuple(kinds),
            "rare_weight": rare_weight, "rare": split == "rare"}
    return _collect("shapes", n, lambda: random_row(rng, **opts), set(exclude), 200 * n + 1000, key=row_key)


def make_shapes_pair(n_train: int, n_test: int, seed: int = 0, *, exclude: Iterable[str] = (),
                     **knobs: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A training set and the rare held-out set (the ``rare`` stream), made first and excluded from training."""
    test = make_shapes(n_test, seed, split="rare", exclude=exclude, **knobs)
    train = make_shapes(n_train, seed, split="train", exclude=set(exclude) | {row_key(r) for r in test}, **knobs)
    return train, test


def image_folder(out: str | Path) -> Path:
    """The folder next to the JSONL file ``out`` that holds its images: ``NAME_images`` (``NAME`` = the file
    name without its suffixes)."""
    out = Path(out)
    return out.with_name(out.name.split(".")[0] + "_images")


def write_shapes(out: str | Path, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Draw every row's scene as ``NAME_images/NNNNNN.png`` next to ``out`` and write the rows, each with its
    ``image`` path relative to ``out``'s folder, to the JSONL file ``out``. Returns the rows written."""
    from dllm_rl.jsonl import write_jsonl

    folder = image_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i, row in enumerate(rows):
        name = f"{i:06d}.png"
        draw_scene(row["objects"], int(row["size"])).save(folder / name, format="PNG")
        written.append({"image": f"{folder.name}/{name}", **row})
    write_jsonl(out, written)
    return written


# ------------------------------------------------------------------------------------------------ task
def _norm(text: str) -> str:
    return " ".join(str(text).lower().replace("-", " ").replace(",", " ").strip().rstrip(".").split())


class ShapesTask(ImageTask):
    """Questions about synthetic shape images, exact-answer reward (see module docstring). Extra arg: ``strict``
    (require the ``<answer>`` tags; default True)."""

    name: ClassVar[str] = "shapes"
    required_fields: ClassVar = (("question", "query"), ("answer",))
    prompt_styles: ClassVar = ("chat", "plain", "compact")

    def __init__(self, data: Any = None, *, strict: bool = True, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.strict = strict

    def format_prompt(self, example: Mapping[str, Any]) -> str:
        """``count red circle\\n`` (compact) or the question with the ``<answer>`` instruction; the image line is
        put first by :class:`~dllm_rl.tasks.image_task.ImageTask`."""
        if self.prompt_style == "compact":
            return f"{example.get('query') or example['question']}\n"
        eg = _EXAMPLE.get(str(example.get("kind")), "3")
        return f"{example.get('question') or example['query']} Give only the answer inside <answer> </answer> " \
               f"tags, for example <answer>{eg}</answer>."

    def extract_answer(self, text: str) -> str | None:
        """The last ``<answer>`` content; non-strict: else the last non-empty line."""
        ans = tagged(text)
        if ans is None and not self.strict:
            lines = [ln for ln in text.strip().splitlines() if ln.strip()]
            ans = lines[-1] if lines else None
        return ans

    def reference_completion(self, example: Mapping[str, Any]) -> str:
        """``<answer>{answer}</answer>``."""
        return f"<answer>{example['answer']}</answer>"

    def _score(self, text: str, example: Mapping[str, Any]) -> Score:
        gold = _norm(example["answer"])
        ans = self.extract_answer(text)
        if ans is None:
            return Score(0.0, "no <answer>...</answer>" if self.strict else "no answer")
        got = _norm(ans[:200])
        if example.get("kind") == "count" or parse_int(gold) is not None:
            ok = parse_int(got) is not None and parse_int(got) == parse_int(gold)
        elif example.get("kind") == "where":
            ok = sorted(got.split()) == sorted(gold.split())
        else:
            ok = got == gold
        if ok:
            return Score(1.0, f"correct: {gold}")
        return Score(0.0, f"wrong: got {got[:40]!r}, expected {gold!r}")
