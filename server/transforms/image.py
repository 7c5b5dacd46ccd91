"""image.decode: JPEG / PNG / WebP bytes -> uint8 pixels of a fixed size, decoded by Pillow.

{"op": "image.decode", "column": "image", "size": [224, 224], "crop": "center" | "random" | "none",
 "mode": "RGB" | "L", "resample": "bilinear", "hflip": false, "normalize": {"mean": [...], "std": [...]},
 "layout": "HWC" | "CHW", "draft": false, "output": column}

Steps, in this order (a direct Pillow decode with the same parameters gives the same pixels):
  1. `Image.open(bytes).convert(mode)` (palette images through RGBA first, as Pillow advises); with
     `"draft": true`, a JPEG is first asked for the smallest DCT scale (1/2, 1/4, 1/8) that still
     covers the size step 2 resizes to (`Image.draft`): the decoder skips most of the work on large
     images, and the pixels are close to, but NOT bit-identical with, a full decode (opt-in; other
     formats decode as usual);
  2. crop "none": `resize((W, H))`; "center"/"random": resize so the image covers H x W keeping its
     aspect ratio (sides `max(W, round(w*s))`, `max(H, round(h*s))` with `s = max(H/h, W/w)`), then
     crop H x W at the center or at a random offset;
  3. `hflip`: mirror with probability 1/2;
  4. `normalize`: float32 `(pixel / 255 - mean) / std` per channel (else uint8);
  5. `layout` "CHW" transposes to channels first.
Random choices come from a generator seeded by (seed, epoch, the sample's global position), so a
resumed or failed-over stream repeats the same crops and flips.
Output: a fixed-shape tensor column [H, W, C] (or [C, H, W]); C = 3 for RGB, 1 for L.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa

from shardstream.errors import InvalidArgumentError

from .base import (
    BatchContext,
    Params,
    Result,
    Transform,
    column_of,
    fixed_tensor,
    is_binary,
    keep_rows,
    map_samples,
    replace_field,
    set_column,
    tensor_type,
)

__all__ = ["ImageDecode", "decode_image"]

CROPS = ("center", "random", "none")
MODES = {"RGB": 3, "L": 1}
RESAMPLE = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
LAYOUTS = ("HWC", "CHW")
MAX_PIXELS = 1 << 27  # 134 M pixels: refuse decompression bombs as bad samples


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - Pillow is in the server extra
        raise InvalidArgumentError(
            "image.decode needs Pillow on the server (pip install 'shardstream[server]')"
        ) from exc
    return Image


def decode_image(
    data: bytes,
    size: tuple[int, int],
    *,
    crop: str = "center",
    mode: str = "RGB",
    resample: str = "bilinear",
    rng: np.random.Generator | None = None,
    hflip: bool = False,
    draft: bool = False,
) -> np.ndarray:
    """One image -> uint8 array (H, W, C). See the module docstring for the steps."""
    Image = _pil()
    method = getattr(Image.Resampling, resample.upper())
    h, w = size
    try:
        opened = Image.open(io.BytesIO(data))
    except Image.UnidentifiedImageError:  # its text names the BytesIO's address: not the same twice
        raise Image.UnidentifiedImageError("cannot identify image file") from None
    with opened as src:
        w0, h0 = src.size
        if w0 * h0 > MAX_PIXELS:
            raise ValueError(f"{w0}x{h0} pixels is over the limit of {MAX_PIXELS}")
        if crop == "none":
            nw, nh = w, h
        else:
            s = max(h / h0, w / w0)
            nw, nh = max(w, round(w0 * s)), max(h, round(h0 * s))
        if draft and src.format == "JPEG":
            src.draft(mode, (nw, nh))  # decodes at the smallest 1/2^k scale still >= (nw, nh)
        img = (src.convert("RGBA") if src.mode == "P" else src).convert(mode)
    img = img.resize((nw, nh), method)
    if crop != "none":
        if crop == "center":
            left, top = (nw - w) // 2, (nh - h) // 2
        else:
            assert rng is not None
            left, top = int(rng.integers(0, nw - w + 1)), int(rng.integers(0, nh - h + 1))
        img = img.crop((left, top, left + w, top + h))
    if hflip and rng is not None and rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    arr = np.asarray(img, dtype=np.uint8)
    return arr.reshape(h, w, -1)


class ImageDecode(Transform):
    op = "image.decode"

    def __init__(self, params: Params, schema: pa.Schema) -> None:
        self.column = params.str("column", "image")
        column_of(self.op, schema, self.column, "a binary column of encoded images", is_binary)
        self.size = params.size("size")
        self.crop = params.str("crop", "center", CROPS)
        self.mode = params.str("mode", "RGB", tuple(MODES))
        self.resample = params.str("resample", "bilinear", RESAMPLE)
        self.hflip = params.bool("hflip", False)
        self.layout = params.str("layout", "HWC", LAYOUTS)
        self.draft = params.bool("draft", False)  # JPEG DCT scaling: cheaper, not bit-identical
        self.output = params.str("output", self.column)
        c = MODES[self.mode]
        norm = params.get("normalize", None)
        self.mean = self.std = None
        if norm is not None:
            if not isinstance(norm, dict) or set(norm) != {"mean", "std"}:
                raise InvalidArgumentError(
                    f'image.decode: parameter \'normalize\' must be {{"mean": [...], "std": [...]}}, got {norm!r}'
                )
            sub = Params(self.op + " normalize", norm)
            self.mean = np.array(sub.floats("mean", c), np.float32)
            self.std = np.array(sub.floats("std", c), np.float32)
            if (self.std <= 0).any():
                raise InvalidArgumentError(
                    f"image.decode: normalize std must be > 0, got {self.std.tolist()}"
                )
        h, w = self.size
        self.shape = (h, w, c) if self.layout == "HWC" else (c, h, w)
        self.dtype = np.dtype(np.float32 if self.mean is not None else np.uint8)
        _pil()
        self.output_schema = replace_field(
            schema, self.output, pa.field(self.output, tensor_type(self.shape, self.dtype))
        )

    @property
    def deterministic(self) -> bool:
        return self.crop != "random" and not self.hflip

    def apply(self, batch: pa.RecordBatch, ctx: BatchContext) -> Result:
        col = batch.column(self.column)
        random = not self.deterministic

        def one(i: int) -> np.ndarray:
            data = col[i].as_py()
            if data is None:
                raise ValueError(f"column {self.column!r} is null")
            arr = decode_image(
                data,
                self.size,
                crop=self.crop,
                mode=self.mode,
                resample=self.resample,
                rng=ctx.rng(i, self.op) if random else None,
                hflip=self.hflip,
                draft=self.draft,
            )
            if self.mean is not None:
                arr = (arr.astype(np.float32) / np.float32(255.0) - self.mean) / self.std
            if self.layout == "CHW":
                arr = np.ascontiguousarray(arr.transpose(2, 0, 1))
            return arr

        images, errors = map_samples(one, len(col), ctx)
        keep = keep_rows(len(col), errors)
        out = batch.take(pa.array(keep)) if errors else batch
        out = set_column(
            out, self.output, fixed_tensor(images, self.shape, self.dtype, keep), self.output_schema
        )
        return Result(out, keep, errors)
