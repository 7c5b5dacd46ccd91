"""Numpy views of Arrow arrays of numbers without nulls, made from their buffers.

pyarrow's `Array.to_numpy` imports pandas the first time it runs in a process where pandas is
installed (~250-360 ms here), and pandas imports pyarrow.compute: a fresh client paid it in its
first batch (its provenance columns), where a restarted rank waits for it. A null-free array of
integers or floats is one buffer of values, so numpy views it directly: the same array as
`to_numpy(zero_copy_only=True)`, read-only as that is, sharing the batch's memory.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["numpy_view"]


def _dtype(t: pa.DataType) -> np.dtype | None:
    if pa.types.is_signed_integer(t):
        return np.dtype(f"int{t.bit_width}")
    if pa.types.is_unsigned_integer(t):
        return np.dtype(f"uint{t.bit_width}")
    if pa.types.is_floating(t):
        return np.dtype(f"float{t.bit_width}")
    return None


def numpy_view(arr: pa.Array) -> np.ndarray:
    """`arr.to_numpy(zero_copy_only=True)` for integers and floats without nulls, from the buffer;
    any other array goes to `to_numpy` itself (a copy where Arrow needs one)."""
    dtype = _dtype(arr.type)
    if dtype is None or arr.null_count:
        return arr.to_numpy(zero_copy_only=False)
    if not len(arr):
        view = np.empty(0, dtype)
    else:
        view = np.frombuffer(arr.buffers()[1], dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    view.flags.writeable = False  # (a received batch's buffers are read-only anyway)
    return view
