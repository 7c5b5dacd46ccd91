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

# Arrow's type ids of the numbers numpy views as they are, and their numpy types
_DTYPES: dict[int, np.dtype] = {
    t.id: np.dtype(d)
    for t, d in (
        (pa.int8(), np.int8),
        (pa.int16(), np.int16),
        (pa.int32(), np.int32),
        (pa.int64(), np.int64),
        (pa.uint8(), np.uint8),
        (pa.uint16(), np.uint16),
        (pa.uint32(), np.uint32),
        (pa.uint64(), np.uint64),
        (pa.float16(), np.float16),
        (pa.float32(), np.float32),
        (pa.float64(), np.float64),
    )
}


def numpy_view(arr: pa.Array) -> np.ndarray:
    """`arr.to_numpy(zero_copy_only=True)` for integers and floats without nulls, from the buffer;
    any other array goes to `to_numpy` itself (a copy where Arrow needs one)."""
    dtype = _DTYPES.get(arr.type.id)
    n = len(arr)
    if dtype is None or arr.null_count:
        return arr.to_numpy(zero_copy_only=False)
    if n:
        view = np.frombuffer(arr.buffers()[1], dtype, n, arr.offset * dtype.itemsize)
    else:
        view = np.empty(0, dtype)
    view.flags.writeable = False  # (a received batch's buffers are read-only anyway)
    return view
