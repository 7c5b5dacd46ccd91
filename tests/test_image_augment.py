"""image.crop (a crop and flip of decoded images) and image.decode's opt-in "draft" JPEG decoding.

image.crop: a center crop is a slice of the decoded image; a random crop and flip depend on (seed,
epoch, position) only, stay inside the image and are the slice or its mirror. draft: the same shape,
close to a full decode on a large JPEG but not bit-identical (documented so), identical where no DCT
scale applies (a PNG, a JPEG less than twice the target), and a parameter like any other.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest

from shardstream.errors import InvalidArgumentError
from shardstream.server.transforms.augment import ImageCrop
from shardstream.server.transforms.base import BatchContext, Params, tensor_array
from shardstream.server.transforms.image import ImageDecode, decode_image


def _images(n: int, h: int = 20, w: int = 30, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def _crop(
    images: np.ndarray, params: dict, seed: int = 0, epoch: int = 0, positions: np.ndarray | None = None
):
    batch = pa.record_batch({"image": tensor_array(images)})
    t = ImageCrop(Params("image.crop", params), batch.schema)
    n = len(images)
    pos = np.arange(n, dtype=np.int64) * 7 + 3 if positions is None else positions
    res = t.apply(batch, BatchContext(seed, epoch, pos, np.zeros(n, np.int64)))
    out = res.batch.column("image")
    return out.storage.flatten().to_numpy().reshape(len(res.index), *params["size"], 3), res


def test_center_crop_is_a_slice() -> None:
    images = _images(5)
    out, res = _crop(images, {"size": [12, 16], "crop": "center"})
    assert np.array_equal(out, images[:, 4:16, 7:23])
    assert res.index.tolist() == list(range(5)) and not res.errors


@pytest.mark.parametrize("hflip", [False, True])
def test_random_crop_and_flip_come_from_seed_epoch_and_position(hflip: bool) -> None:
    images = _images(40)
    params = {"size": [12, 16], "crop": "random", "hflip": hflip}
    a, _ = _crop(images, params, seed=1, epoch=2)
    b, _ = _crop(images, params, seed=1, epoch=2)
    c, _ = _crop(images, params, seed=2, epoch=2)
    assert np.array_equal(a, b)  # a resumed stream repeats the draws
    assert not np.array_equal(a, c)  # another job draws others
    flipped = 0
    for img, got in zip(images, a, strict=True):  # each output is a slice of its image, or its mirror
        slices = [img[t : t + 12, x : x + 16] for t in range(9) for x in range(15)]
        plain = any(np.array_equal(got, s) for s in slices)
        mirror = any(np.array_equal(got, s[:, ::-1]) for s in slices)
        assert plain or mirror
        flipped += mirror and not plain
    assert (flipped > 0) == hflip


def test_crop_parameters_are_checked() -> None:
    schema = pa.record_batch({"image": tensor_array(_images(1))}).schema
    with pytest.raises(InvalidArgumentError, match="larger than the images"):
        ImageCrop(Params("image.crop", {"size": [21, 10]}), schema)
    with pytest.raises(InvalidArgumentError, match="must be a decoded image column"):
        ImageCrop(Params("image.crop", {"size": [2, 2]}), pa.schema([("image", pa.binary())]))
    with pytest.raises(InvalidArgumentError, match="crop"):
        ImageCrop(Params("image.crop", {"size": [2, 2], "crop": "top"}), schema)


def test_a_null_image_is_a_bad_sample() -> None:
    images = _images(3)
    col = tensor_array(images)
    storage = pa.FixedSizeListArray.from_arrays(
        col.storage.values, col.type.storage_type.list_size, mask=pa.array([False, True, False])
    )
    batch = pa.record_batch({"image": pa.ExtensionArray.from_storage(col.type, storage)})
    t = ImageCrop(Params("image.crop", {"size": [10, 10], "crop": "center"}), batch.schema)
    res = t.apply(batch, BatchContext(0, 0, np.arange(3, dtype=np.int64), np.zeros(3, np.int64)))
    assert res.index.tolist() == [0, 2] and [i for i, _ in res.errors] == [1]


def test_a_center_crop_without_flip_is_deterministic_a_random_one_is_not() -> None:
    schema = pa.record_batch({"image": tensor_array(_images(1))}).schema
    assert ImageCrop(Params("image.crop", {"size": [5, 5], "crop": "center"}), schema).deterministic
    assert not ImageCrop(Params("image.crop", {"size": [5, 5]}), schema).deterministic
    assert not ImageCrop(
        Params("image.crop", {"size": [5, 5], "crop": "center", "hflip": True}), schema
    ).deterministic


# --- draft --------------------------------------------------------------------------------------
def _encoded(fmt: str, w: int, h: int) -> bytes:
    from PIL import Image

    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([127 + 120 * np.sin(0.01 * (c + 1) * xx + 0.013 * yy) for c in range(3)], axis=-1)
    buf = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(buf, format=fmt, quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("crop", ["center", "none", "random"])
def test_draft_decodes_a_large_jpeg_close_to_a_full_decode(crop: str) -> None:
    data = _encoded("JPEG", 1024, 768)
    rng = lambda: np.random.default_rng(5)  # noqa: E731 — the same draws for both
    full = decode_image(data, (64, 80), crop=crop, rng=rng())
    draft = decode_image(data, (64, 80), crop=crop, rng=rng(), draft=True)
    assert draft.shape == full.shape == (64, 80, 3) and draft.dtype == np.uint8
    assert not np.array_equal(draft, full)  # not bit-identical: documented
    assert np.abs(draft.astype(int) - full.astype(int)).mean() < 4


@pytest.mark.parametrize(("fmt", "w", "h"), [("PNG", 1024, 768), ("JPEG", 300, 200)])
def test_draft_changes_nothing_where_no_scale_applies(fmt: str, w: int, h: int) -> None:
    data = _encoded(fmt, w, h)
    assert np.array_equal(decode_image(data, (150, 200), draft=True), decode_image(data, (150, 200)))


def test_draft_is_a_checked_parameter() -> None:
    schema = pa.schema([("image", pa.binary())])
    assert ImageDecode(Params("image.decode", {"size": 8, "draft": True}), schema).draft
    with pytest.raises(InvalidArgumentError, match="draft"):
        ImageDecode(Params("image.decode", {"size": 8, "draft": "yes"}), schema)
