"""Image limits (``ImageLimits``): an image's encoded size and the size its header declares are checked before a
pixel is decoded, as one-line DataErrors naming the row and column, through every way an image arrives (a path,
bytes, a data URI, a PIL image, a ``datasets`` dict, an image task's rows, SFT rows); Pillow's decompression-bomb
warning becomes the same refusal; the defaults accept the project's real images."""

from __future__ import annotations

import base64
import json
import re
import time
import warnings

import pytest
from big_images import zero_png
from PIL import Image

from dllm_rl.config import ConfigError
from dllm_rl.tasks import DataError, get_task
from dllm_rl.tasks.image_limits import ImageLimits, check_size
from dllm_rl.tasks.images import load_image
from dllm_rl.tasks.shapes import make_shapes, write_shapes

WHERE = "rows.jsonl, line 2: column 'image'"
#: the probe's images: (width, height) -> what the one line says about them
BOMBS = {
    (20000, 1): "(20000x1 px): its 20000 px side is over the limit of 16384 px (image_limits.max_side); use a "
                "smaller image or raise the limit",
    (1, 40000): "(1x40000 px): its 40000 px side is over the limit of 16384 px (image_limits.max_side)",
    (13000, 13000): "(13000x13000 px): its 169,000,000 pixels are over the limit of 40,000,000 "
                    "(image_limits.max_pixels)",
}


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    """The three probe images as PNG files (a few hundred bytes to 20 KB each): size -> path."""
    d = tmp_path_factory.mktemp("bombs")
    paths = {size: d / f"{size[0]}x{size[1]}.png" for size in BOMBS}
    for size, path in paths.items():
        zero_png(*size, path)
    return paths


@pytest.mark.parametrize("size", list(BOMBS), ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_probe_images_are_refused_from_their_header(bombs, size):
    """As a path, raw bytes, a data URI and a ``datasets`` dict: refused in milliseconds, naming the row and column,
    and without Pillow's DecompressionBombWarning (the 13000 x 13000 one used to decode at 4 GB with it)."""
    path = bombs[size]
    data = path.read_bytes()
    values = {f"image file {path}": str(path), "the image bytes": data,
              "the embedded image": "data:image/png;base64," + base64.b64encode(data).decode(),
              "the image bytes ": {"bytes": data, "path": None}}
    for what, value in values.items():
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning would raise here
            with pytest.raises(DataError) as err:
                load_image(value, where=WHERE)
        assert str(err.value).startswith(f"{WHERE}: {what.strip()} {BOMBS[size]}"), str(err.value)
        assert "\n" not in str(err.value) and time.perf_counter() - start < 1.0


def test_a_huge_file_is_refused_by_its_size_before_it_is_read(tmp_path):
    big = tmp_path / "huge.png"
    with big.open("wb") as fh:
        fh.truncate(3 * 2**30)  # sparse: no disk used
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"^rows.jsonl, line 2: column 'image': image file .*huge.png \(3,072.0 MiB\): "
                                        r"over the limit of 100 MiB \(image_limits.max_file_mb\); use a smaller file"):
        load_image(big, where=WHERE)
    assert time.perf_counter() - start < 1.0


def test_a_data_uri_is_measured_before_it_is_decoded():
    """The limit applies to the decoded size, computed from the text's length: an over-long URI is refused as too
    large even when its base64 is invalid (it was never decoded)."""
    limits = ImageLimits(max_file_mb=0.01)  # 10 KiB
    uri = "data:image/png;base64," + "!" * 20000
    with pytest.raises(DataError, match=r"^row: the embedded image \(0.0 MiB\): over the limit of 0.01 MiB"):
        load_image(uri, where="row", limits=limits)
    with pytest.raises(DataError, match=r"^row: the image bytes \(0.0 MiB\): over the limit of 0.01 MiB"):
        load_image(b"\0" * 20000, where="row", limits=limits)
    with pytest.raises(DataError, match="invalid base64"):  # under the limit: decoded, and found invalid
        load_image("data:image/png;base64," + "!" * 200, where="row", limits=limits)


def test_a_pil_image_is_checked_before_it_is_loaded(bombs):
    lazy = Image.open(bombs[(20000, 1)])  # only the header read
    with pytest.raises(DataError, match=r"^row: the image \(20000x1 px\): its 20000 px side is over the limit"):
        load_image(lazy, where="row")
    assert lazy.tile  # never loaded: Pillow clears an image's tiles (what is left to decode) when it loads it


@pytest.mark.parametrize("limits, size, says", [
    ({"max_aspect": 4}, (50, 10), "its aspect ratio 5:1 is over the limit of 4:1 (image_limits.max_aspect)"),
    ({"max_pixels": 400}, (30, 20), "its 600 pixels are over the limit of 400 (image_limits.max_pixels)"),
    ({"max_side": 25}, (30, 20), "its 30 px side is over the limit of 25 px (image_limits.max_side)"),
])
def test_each_limit_is_a_setting(limits, size, says):
    data = zero_png(*size)
    with pytest.raises(DataError, match=rf"^row: the image bytes \({size[0]}x{size[1]} px\): {re.escape(says)}"):
        load_image(data, where="row", limits=ImageLimits(**limits))
    assert load_image(data, where="row").size == size  # the defaults accept it




def test_pillows_own_limit_is_our_refusal(monkeypatch):
    """Over Pillow's MAX_IMAGE_PIXELS (lowered here to 1000, under max_pixels) and under twice it, Pillow would warn
    and decode; over twice it, Image.open raises. Both are one-line DataErrors, with no warning printed."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError, match=r"^row: the image bytes \(40x40 px\): its 1,600 pixels are over Pillow's "
                                            r"decompression-bomb limit of 1,000; use a smaller image"):
            load_image(zero_png(40, 40), where="row")
        with pytest.raises(DataError, match=r"^row: the image bytes: over Pillow's decompression-bomb limit \(Image "
                                            r"size \(2500 pixels\) exceeds limit of 2000 pixels"):
            load_image(zero_png(50, 50), where="row")


def test_the_defaults_accept_the_projects_real_images():
    """LLaDA-V's 384 px tile and its 2304 px anyres grid, MMaDA's 512 px, 12 to 36 megapixel photographs, a
    16384 px panorama, the shapes task's 32-96 px scenes (checked from the size alone: nothing is decoded)."""
    limits = ImageLimits()
    for size in ((384, 384), (2304, 2304), (512, 512), (4032, 3024), (3024, 4032), (7360, 4912), (16384, 2048),
                 (32, 32), (96, 96), (1280, 32)):
        check_size(*size, limits, "the image", "row")


def test_an_image_task_takes_its_limits_as_an_option_and_names_the_row(tmp_path):
    data = tmp_path / "shapes.jsonl"
    rows = write_shapes(data, make_shapes(2, seed=0, size=48))
    with pytest.raises(DataError, match=rf"^{re.escape(str(data))}, line 1: column 'image': image file .*000000.png "
                                        r"\(48x48 px\): its 48 px side is over the limit of 40 px"):
        get_task("shapes", data=str(data), image_limits={"max_side": 40}).load()
    assert len(get_task("shapes", data=str(data)).load()) == 2
    with pytest.raises(ConfigError, match=r"^image_limits: unknown key 'max_sid'; did you mean 'max_side'"):
        get_task("shapes", data=str(data), image_limits={"max_sid": 40})
    with pytest.raises(ConfigError, match=r"^image_limits.max_side: must be >= 1, got 0"):
        get_task("shapes", data=str(data), image_limits={"max_side": 0})
    zero_png(20000, 1, tmp_path / "thin.png")
    data.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], "image": "thin.png"}) + "\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(data))}, line 2: column 'image': image file .*thin.png "
                                        r"\(20000x1 px\): its 20000 px side"):
        get_task("shapes", data=str(data)).load()


def test_sft_rows_read_images_through_the_same_limits(tmp_path):
    """An SFT row with a bomb image is a bad row (``bad_image``) whose reason is the limit."""
    from dllm_rl.sft.data import BadRow, _row_images

    zero_png(13000, 13000, tmp_path / "bomb.png")
    with pytest.raises(BadRow) as err:
        _row_images({"image": "bomb.png", "prompt": "x"}, "data.jsonl, line 4", tmp_path)
    assert err.value.reason == "bad_image"
    assert "(13000x13000 px): its 169,000,000 pixels are over the limit of 40,000,000" in str(err.value)
