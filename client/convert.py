"""Arrow record batches -> numpy arrays or torch tensors, without copies where Arrow allows.

Zero-copy: numeric columns without nulls, fixed-size lists of them (any nesting) and fixed-shape
tensors (what server-side transforms send: decoded images, audio, video frames, RL windows), which
become arrays of shape (rows, d1, d2, ...). Variable-length lists whose rows in the batch all have the same
length (e.g. JSON arrays of features) are reshaped the same way, also without a copy. These share memory with the received message: treat them as
read-only (numpy marks them so) or `.clone()` a tensor before writing into it in place.

Copied: booleans (Arrow packs them into bits), columns with nulls (numpy gets floats with NaN or
objects), strings and binary (a Python list / numpy object array), variable-length lists of
unequal lengths (an object array of arrays). Those are not tensors: "torch" output leaves them as numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["to_numpy", "to_torch"]


def _uniform_list_size(arr: pa.Array) -> int | None:
    """The common length of a null-free list column whose rows all have the same length."""
    if arr.null_count:
        return None
    if pa.types.is_fixed_size_list(arr.type):
        return arr.type.list_size
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        sizes = np.diff(arr.offsets.to_numpy())
        if not len(sizes):
            return 0  # an empty batch (a rank's share of a short last step): shape (0, 0)
        if (sizes == sizes[0]).all():
            return int(sizes[0])
    return None


def _fixed_shape(arr: pa.Array) -> tuple[pa.Array, tuple[int, ...]] | None:
    """(flat primitive values, per-row shape) when `arr` is a null-free nest of equal-length lists
    or a fixed-shape tensor (Arrow's canonical extension type, row-major)."""
    if isinstance(arr.type, pa.BaseExtensionType):
        t = arr.type
        if not isinstance(t, pa.FixedShapeTensorType) or arr.null_count:
            return None
        if t.permutation is not None and list(t.permutation) != list(range(len(t.shape))):
            return None
        inner = _fixed_shape(arr.storage)
        return None if inner is None else (inner[0], tuple(t.shape))
    shape: list[int] = []
    while (
        pa.types.is_fixed_size_list(arr.type)
        or pa.types.is_list(arr.type)
        or pa.types.is_large_list(arr.type)
    ):
        size = _uniform_list_size(arr)
        if size is None:
            return None
        shape.append(size)
        arr = arr.flatten()
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)) or arr.null_count:
        return None
    return arr, tuple(shape)


def _column_numpy(arr: pa.Array) -> np.ndarray:
    fixed = _fixed_shape(arr)
    if fixed is not None:
        values, shape = fixed
        return values.to_numpy(zero_copy_only=True).reshape((len(arr), *shape))
    return arr.to_numpy(zero_copy_only=False)


def to_numpy(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    return {name: _column_numpy(col) for name, col in zip(batch.schema.names, batch.columns, strict=True)}


def to_torch(batch: pa.RecordBatch) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        fixed = _fixed_shape(col)
        if fixed is not None and not pa.types.is_float16(fixed[0].type):
            values, shape = fixed
            out[name] = torch.from_dlpack(values).reshape((len(col), *shape))
        elif pa.types.is_boolean(col.type) and not col.null_count:
            out[name] = torch.from_numpy(col.to_numpy(zero_copy_only=False))
        else:
            out[name] = _column_numpy(col)
    return out
