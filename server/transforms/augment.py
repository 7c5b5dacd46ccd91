"""image.crop: a crop (and flip) of decoded images — the augmentation that runs after a shared decode.

{"op": "image.crop", "column": "image", "size": [224, 224], "crop": "random" | "center",
 "hflip": false, "output": column}

Input: a decoded image column of shape [H, W, C] (image.decode's "HWC" layout, uint8 or float32),
H >= height and W >= width. Output: [height, width, C] of the same type, cropped at the center or at
a random offset, then mirrored with probability 1/2 when `hflip`. Random choices come from a
generator seeded by (seed, epoch, the sample's global position), as image.decode's do, so a resumed
or failed-over stream repeats the same crops and flips.

Why a crop of its own: `image.decode` with crop "center" or "none" and no hflip is deterministic, so
its output is computed once per row group and shared by every job that asks for it (the feature
cache, server/read/feature_cache.py); `image.crop` after it keeps each job's augmentation its own. E.g.
`[{"op": "image.decode", "size": [256, 256]}, {"op": "image.crop", "size": [224, 224], "crop":
"random", "hflip": true}]`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from shardstream.errors import InvalidArgumentError

from .base import (
    BatchContext,
    Params,
    Result,
    Transform,
    column_of,
    keep_rows,
    replace_field,
    set_column,
    tensor_array,
    tensor_type,
)

__all__ = ["ImageCrop"]

CROPS = ("random", "center")


def _image_shape(t: pa.DataType) -> bool:
    return isinstance(t, pa.FixedShapeTensorType) and len(t.shape) == 3


class ImageCrop(Transform):
    op = "image.crop"

    def __init__(self, params: Params, schema: pa.Schema) -> None:
        self.column = params.str("column", "image")
        field = column_of(
            self.op,
            schema,
            self.column,
            "a decoded image column [H, W, C] (image.decode, layout HWC)",
            _image_shape,
        )
        self.size = params.size("size")
        self.crop = params.str("crop", "random", CROPS)
        self.hflip = params.bool("hflip", False)
        self.output = params.str("output", self.column)
        height, width, channels = (int(x) for x in field.type.shape)
        h, w = self.size
        if h > height or w > width:
            raise InvalidArgumentError(
                f"image.crop: size {[h, w]} is larger than the images of column {self.column!r} ({[height, width]})"
            )
        self.in_shape = (height, width, channels)
        self.dtype = np.dtype(field.type.value_type.to_pandas_dtype())
        self.output_schema = replace_field(
            schema, self.output, pa.field(self.output, tensor_type((h, w, channels), self.dtype))
        )

    @property
    def deterministic(self) -> bool:
        return self.crop == "center" and not self.hflip

    def apply(self, batch: pa.RecordBatch, ctx: BatchContext) -> Result:
        col = batch.column(self.column)
        n = len(col)
        storage = col.storage if isinstance(col, pa.ExtensionArray) else col
        per_row = int(np.prod(self.in_shape))
        values = storage.values.to_numpy(zero_copy_only=False)
        images = values[storage.offset * per_row : (storage.offset + n) * per_row].reshape(n, *self.in_shape)
        errors = [(i, f"column {self.column!r} is null") for i in np.nonzero(col.is_null())[0].tolist()]
        keep = keep_rows(n, errors)
        height, width, _ = self.in_shape
        h, w = self.size
        out = np.empty((len(keep), h, w, self.in_shape[2]), self.dtype)
        mirror = np.arange(w - 1, -1, -1, dtype=np.intp)
        for j, i in enumerate(keep.tolist()):
            if self.crop == "center":
                top, left = (height - h) // 2, (width - w) // 2
                rng = ctx.rng(i, self.op) if self.hflip else None
            else:
                rng = ctx.rng(i, self.op)
                top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            crop = images[i, top : top + h, left : left + w]
            if self.hflip and rng is not None and rng.random() < 0.5:
                np.take(crop, mirror, axis=1, out=out[j])  # ~2x faster than copying crop[:, ::-1]
            else:
                out[j] = crop
        rows = batch.take(pa.array(keep)) if errors else batch
        return Result(set_column(rows, self.output, tensor_array(out), self.output_schema), keep, errors)
