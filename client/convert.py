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

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from shardstream.numpy_view import numpy_view

__all__ = ["splitter", "to_numpy", "to_torch"]


def _uniform_list_size(arr: pa.Array) -> int | None:
    """The common length of a null-free list column whose rows all have the same length."""
    if arr.null_count:
        return None
    if pa.types.is_fixed_size_list(arr.type):
        return arr.type.list_size
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        sizes = np.diff(numpy_view(arr.offsets))
        if not len(sizes):
            return 0  # an empty batch (a rank's share of a short last step): shape (0, 0)
        if (sizes == sizes[0]).all():
            return int(sizes[0])
    return None


def _flat(arr: pa.Array, size: int) -> pa.Array:
    """`arr.flatten()` of a null-free list column of rows of `size` values: for a fixed-size list,
    the slice of its values that its rows cover (flatten is a compute call there: ~5 us, the slice
    ~0.5 us)."""
    if pa.types.is_fixed_size_list(arr.type):
        return arr.values.slice(arr.offset * size, len(arr) * size)
    return arr.flatten()


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
        arr = _flat(arr, size)
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)) or arr.null_count:
        return None
    return arr, tuple(shape)


def _column_numpy(arr: pa.Array) -> np.ndarray:
    fixed = _fixed_shape(arr)
    if fixed is not None:
        values, shape = fixed
        return numpy_view(values).reshape((len(arr), *shape))
    return arr.to_numpy(zero_copy_only=False)


def to_numpy(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    return {name: _column_numpy(col) for name, col in zip(batch.schema.names, batch.columns, strict=True)}


def _torch_fixed(col: pa.Array) -> Any:
    """A zero-copy tensor of shape (rows, d1, ...) for a fixed-shape numeric column, else None."""
    fixed = _fixed_shape(col)
    if fixed is None or pa.types.is_float16(fixed[0].type):
        return None
    import torch

    values, shape = fixed
    return torch.from_dlpack(values).reshape((len(col), *shape))


def _column_torch(col: pa.Array) -> Any:
    tensor = _torch_fixed(col)
    if tensor is not None:
        return tensor
    if pa.types.is_boolean(col.type) and not col.null_count:
        import torch

        return torch.from_numpy(col.to_numpy(zero_copy_only=False))
    return _column_numpy(col)


def to_torch(batch: pa.RecordBatch) -> dict[str, Any]:
    return {name: _column_torch(col) for name, col in zip(batch.schema.names, batch.columns, strict=True)}


def splitter(batch: pa.RecordBatch, output: str) -> Callable[[int, int], Any]:
    """`split(start, rows)`: the same value as converting `batch.slice(start, rows)` ("numpy",
    "torch" or "arrow"), made cheaply for the many small steps of one message: each fixed-shape
    numeric column is converted once for the whole batch and sliced per step (a view, as the
    per-step conversion is); other columns (nulls, strings, booleans, ragged lists), and empty
    steps, are converted step by step exactly as `to_numpy`/`to_torch` do.
    """
    if output == "arrow":
        return batch.slice
    names = batch.schema.names
    whole: dict[str, Any] = {}
    for name, col in zip(names, batch.columns, strict=True):
        if output == "torch":
            tensor = _torch_fixed(col)
            if tensor is not None:
                whole[name] = tensor
        else:
            fixed = _fixed_shape(col)
            if fixed is not None:
                values, shape = fixed
                whole[name] = numpy_view(values).reshape((len(col), *shape))
    per_step = [i for i, name in enumerate(names) if name not in whole]
    convert = _column_torch if output == "torch" else _column_numpy

    def split(start: int, rows: int) -> Any:
        if rows == 0:  # an empty step: its own shapes (e.g. (0, 0) for a ragged-list column)
            return to_torch(batch.slice(start, 0)) if output == "torch" else to_numpy(batch.slice(start, 0))
        out = {}
        if per_step:
            part = batch.slice(start, rows)
            out.update((names[i], convert(part.column(i))) for i in per_step)
        end = start + rows
        out.update((name, arr[start:end]) for name, arr in whole.items())
        return {name: out[name] for name in names}  # the batch's column order

    return split
