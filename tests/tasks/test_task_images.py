"""Images in data rows: one image read from a path, a data URI, bytes, a PIL image and a `datasets` Image feature
gives the same pixels; JSONL, Parquet and `hf:` rows load; a missing column, a missing or unreadable file and a
placeholder mismatch are one-line DataErrors naming the row and column."""

from __future__ import annotations

import base64
import io
import json

import pytest
from hub_fixture import populate_hub_cache
from PIL import Image

from dllm_rl.tasks import DataError, get_task
from dllm_rl.tasks.images import load_image, row_images, with_placeholders
from dllm_rl.tasks.shapes import draw_scene

OBJECTS = [{"shape": "square", "colour": "red", "row": 0, "col": 0},
           {"shape": "circle", "colour": "blue", "row": 2, "col": 1}]


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def scene(tmp_path):
    """A 48 px scene (a red square top left, a blue circle bottom center) saved as img/a.png under tmp_path."""
    img = draw_scene(OBJECTS, 48)
    (tmp_path / "img").mkdir()
    img.save(tmp_path / "img" / "a.png")
    return img


def choice_row(image, **extra):
    return {"question": "Which shape is red?", "options": ["circle", "square"], "answer": "B", "image": image,
            **extra}


def test_one_image_from_path_uri_bytes_pil_and_datasets_feature_has_the_same_pixels(tmp_path, scene):
    import datasets

    data = png_bytes(scene)
    ds = datasets.Dataset.from_dict({"image": [str(tmp_path / "img" / "a.png")]},
                                    features=datasets.Features({"image": datasets.Image()}))
    raw = ds.cast_column("image", datasets.Image(decode=False))[0]["image"]  # {'bytes': ..., 'path': ...}
    values = {
        "relative path": "img/a.png",
        "absolute path": tmp_path / "img" / "a.png",
        "data URI": "data:image/png;base64," + base64.b64encode(data).decode(),
        "bytes": data,
        "PIL (RGBA)": scene.convert("RGBA"),
        "datasets Image (decoded)": ds[0]["image"],
        "datasets Image dict": raw,
        "bytes-only dict": {"bytes": data, "path": None},
    }
    for what, value in values.items():
        img = load_image(value, base_dir=tmp_path, where="row")
        assert img.mode == "RGB" and img.size == (48, 48), what
        assert img.tobytes() == scene.tobytes(), what
    assert img.getpixel((5, 5)) == (230, 30, 30) and img.getpixel((24, 40)) == (30, 70, 230)
    two = row_images({"images": ["img/a.png", data]}, "images", tmp_path, "row")
    assert [i.tobytes() == scene.tobytes() for i in two] == [True, True]


def test_jsonl_rows_with_relative_paths_and_image_lists(tmp_path, scene):
    data = tmp_path / "sub" / "mc.jsonl"
    data.parent.mkdir()
    scene.save(data.parent / "pic.png")
    rows = [choice_row("pic.png"),
            {"question": "<image> left, <image> right: same colour?", "options": ["yes", "no"], "answer": 0,
             "images": ["pic.png", "pic.png"]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:1]))
    task = get_task(str(data), task_type="image_choice")
    ex = task.examples[0]
    assert task.image_column == "image" and task.image_dir == data.parent.resolve()
    assert ex["prompt"] == ("<image>\nWhich shape is red?\nA. circle\nB. square\n"
                            "Answer with the option's letter from the given choices directly.")
    assert task.images(ex)[0].tobytes() == scene.tobytes()
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))
    task = get_task(str(data), task_type="image_choice")
    ex = task.examples[0]
    assert task.image_column == "images" and ex["answer_letter"] == "A"
    assert ex["prompt"].startswith("<image> left, <image> right: same colour?\nA. yes\nB. no\n")  # its own places
    assert len(task.images(ex)) == 2


def test_parquet_and_hub_rows_with_a_datasets_image_column(tmp_path, scene, offline_hub):
    import datasets

    ds = datasets.Dataset.from_dict(
        {"question": ["Which shape is red?"], "choice_a": ["circle"], "choice_b": ["square"], "answer": ["B"],
         "image": [scene]},
        features=datasets.Features({"question": datasets.Value("string"), "choice_a": datasets.Value("string"),
                                    "choice_b": datasets.Value("string"), "answer": datasets.Value("string"),
                                    "image": datasets.Image()}))
    path = tmp_path / "seed.parquet"
    ds.to_parquet(str(path))
    task = get_task(str(path), task_type="image_choice")  # read by pyarrow: the image is a {'bytes', 'path'} dict
    assert isinstance(task.examples[0]["image"], dict) and task.examples[0]["options"] == ["circle", "square"]
    assert task.images(task.examples[0])[0].tobytes() == scene.tobytes()
    assert task.score_one("(B)", task.examples[0]) == 1.0
    populate_hub_cache(offline_hub, "org/seed-tiny", {"data/test-00000-of-00001.parquet": path},
                       repo_type="dataset")
    task = get_task("hf:org/seed-tiny@test", task_type="image_choice")  # read by datasets: a PIL image
    assert isinstance(task.examples[0]["image"], Image.Image)
    assert task.images(task.examples[0])[0].tobytes() == scene.tobytes()


def errors(rows, tmp_path, name="rows.jsonl", **opts):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as err:
        get_task(str(path), task_type="image_choice", **opts).load()
    msg = str(err.value)
    assert "\n" not in msg
    return msg.replace(str(tmp_path), "TMP")


def test_bad_images_are_one_line_errors_naming_file_row_and_column(tmp_path, scene):
    (tmp_path / "broken.png").write_bytes(png_bytes(scene)[:60])
    (tmp_path / "notes.png").write_text("not an image")
    good = choice_row("img/a.png")
    assert errors([good, choice_row("img/missing.png")], tmp_path) == (
        "TMP/rows.jsonl, line 2: column 'image': image file 'img/missing.png' not found (looked for "
        "TMP/img/missing.png; relative paths are read from the data file's folder); fix the path or add the file")
    assert errors([choice_row("notes.png")], tmp_path).startswith(
        "TMP/rows.jsonl, line 1: column 'image': image file TMP/notes.png is not a readable image "
        "(UnidentifiedImageError: cannot identify image file")
    assert errors([good, good, choice_row("broken.png")], tmp_path).startswith(
        "TMP/rows.jsonl, line 3: column 'image': image file TMP/broken.png is not a readable image (")
    row = {k: v for k, v in good.items() if k != "image"}
    assert errors([row], tmp_path) == (
        "TMP/rows.jsonl, line 1: no image column ('image' or 'images') in the row (row has: answer, options, "
        "question); add one or name it with image_column=")
    assert errors([good], tmp_path, image_column="picture") == (
        "TMP/rows.jsonl, line 1: missing image column 'picture' (row has: answer, image, options, question); add it "
        "or name the image column with image_column=")
    assert errors([choice_row(12)], tmp_path) == (
        "TMP/rows.jsonl, line 1: column 'image': a int is not an image; give a file path, bytes, a PIL image or a "
        "{'bytes', 'path'} dict")
    assert errors([choice_row([])], tmp_path) == "TMP/rows.jsonl, line 1: column 'image' holds no image (an empty list)"
    assert errors([choice_row(["img/a.png", "img/missing.png"])], tmp_path, name="two.jsonl").startswith(
        "TMP/two.jsonl, line 1: column 'image'[1]: image file 'img/missing.png' not found")


def test_placeholder_count_must_match_the_images(tmp_path, scene):
    assert with_placeholders("What is shown?", 2) == "<image>\n<image>\nWhat is shown?"
    assert with_placeholders("Compare <image> and <image>.", 2) == "Compare <image> and <image>."
    mismatch = choice_row(["img/a.png", "img/a.png"], question="What is in <image>?")
    assert errors([mismatch], tmp_path) == (
        "TMP/rows.jsonl, line 1: the prompt has 1 '<image>' placeholder(s) but column 'image' holds 2 image(s); "
        "give one image per placeholder")
    with pytest.raises(DataError, match=r"^rows\[1\]: the prompt has 3 '<image>' placeholder\(s\) but column "
                                        r"'image' holds 1 image"):  # counted before the (absent) file is read
        get_task("image_choice", data=[choice_row(scene), choice_row("x.png", question="<image>" * 3)]).load()
