from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from shardstream.client.convert import splitter, to_numpy, to_torch
from shardstream.ipc import ipc_bytes, read_ipc
from shardstream.numpy_view import numpy_view


def received(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` as the client sees it: decoded from an Arrow IPC stream, as Flight's reader does."""
    return read_ipc(ipc_bytes(batch))


def sample() -> pa.RecordBatch:
    n = 50
    return pa.record_batch(
        {
            "i": np.arange(n, dtype=np.int64),
            "f": np.linspace(0, 1, n, dtype=np.float32),
            "img": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 6, dtype=np.uint8)), 3), 2
            ),
            "flag": pa.array([i % 2 == 0 for i in range(n)]),
            "s": pa.array([f"s{i}" for i in range(n)]),
            "maybe": pa.array([None if i % 3 == 0 else i for i in range(n)], type=pa.int32()),
        }
    )


def test_torch_zero_copy_for_numeric_and_fixed_size_lists() -> None:
    batch = received(sample()).slice(5, 20)  # a slice, as when a message carries several steps
    out = to_torch(batch)
    assert out["i"].data_ptr() == batch.column("i").buffers()[1].address + 5 * 8
    assert out["img"].shape == (20, 2, 3) and out["img"].dtype == torch.uint8
    assert out["img"][0].flatten().tolist() == list(range(30, 36))
    img_values = batch.column("img").flatten().flatten()
    assert out["img"].data_ptr() == img_values.buffers()[1].address + img_values.offset
    assert out["flag"].dtype == torch.bool and out["flag"].tolist() == [i % 2 == 0 for i in range(5, 25)]
    assert list(out["s"][:2]) == ["s5", "s6"]
    assert np.isnan(out["maybe"][1])  # index 6 is null: numpy float with NaN (a copy)


def test_numpy_views_are_read_only_and_shaped() -> None:
    out = to_numpy(received(sample()))
    assert out["img"].shape == (50, 2, 3)
    assert not out["i"].flags.writeable
    assert out["f"].dtype == np.float32


def test_empty_batch_converts() -> None:
    empty = received(sample().slice(0, 0))
    assert to_torch(empty)["img"].shape == (0, 2, 3)
    assert to_numpy(empty)["i"].shape == (0,)


def test_equal_length_variable_lists_are_reshaped_without_copy() -> None:
    batch = received(
        pa.record_batch(
            {
                "v": pa.array([[float(i), 1.0, 2.0] for i in range(10)]),
                "ragged": pa.array([[1] * (i % 3) for i in range(10)]),
            }
        )
    ).slice(2, 5)
    out = to_torch(batch)
    assert out["v"].shape == (5, 3) and out["v"][0].tolist() == [2.0, 1.0, 2.0]
    values = batch.column("v").flatten()
    assert out["v"].data_ptr() == values.buffers()[1].address + values.offset * 8
    assert out["ragged"].dtype == object  # unequal lengths stay numpy objects


def test_empty_variable_list_column_is_still_a_tensor() -> None:
    out = to_torch(received(pa.record_batch({"v": pa.array([[1.0, 2.0]])}).slice(0, 0)))
    assert isinstance(out["v"], torch.Tensor) and out["v"].shape[0] == 0


def _same(a: object, b: object) -> None:
    """Equal values, dtypes and shapes (numpy arrays, tensors, object arrays of strings/lists)."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)  # type: ignore[union-attr]
        return
    assert a.dtype == b.dtype and a.shape == b.shape  # type: ignore[attr-defined]
    if a.dtype == object:  # type: ignore[attr-defined]
        assert all(
            np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
            for x, y in zip(a, b, strict=True)  # type: ignore[call-overload]
        )
    else:
        np.testing.assert_array_equal(a, b)
        assert a.flags.writeable == b.flags.writeable  # type: ignore[attr-defined]


def test_splitter_gives_what_per_step_conversion_gives() -> None:
    base = sample()
    n = base.num_rows
    rng = np.random.default_rng(0)
    lists = [[i] * 3 for i in range(n)]  # equal lengths: reshaped without a copy
    ragged = [[i] * (1 + i % 2) for i in range(n)]  # unequal over the batch, equal inside some steps
    batch = received(
        base.append_column("vl", pa.array(lists, type=pa.list_(pa.int16())))
        .append_column("rl", pa.array(ragged, type=pa.list_(pa.float32())))
        .append_column("h", pa.array(rng.random(n).astype(np.float16)))
    )
    cuts = [0, 0, 1, 2, 2, 7, 20, 20, 21, 50, 50]  # steps of 0, 1, 2, 13, ... rows, some empty
    for output in ("numpy", "torch", "arrow"):
        split = splitter(batch, output)
        for start, end in zip(cuts, cuts[1:], strict=False):
            got, want = split(start, end - start), batch.slice(start, end - start)
            if output == "arrow":
                assert got.equals(want)
                continue
            want = to_torch(want) if output == "torch" else to_numpy(want)
            assert list(got) == list(want)
            for name in want:
                _same(got[name], want[name])


_NUMBER_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
                 pa.float16(), pa.float32(), pa.float64()]


def test_numpy_view_is_to_numpy_without_pyarrows_conversion() -> None:
    """Numbers without nulls, whole or sliced anywhere, received over IPC or not: the values, dtype
    and read-only view over the batch's memory that `to_numpy(zero_copy_only=True)` gives."""
    rng = np.random.default_rng(7)
    for t in _NUMBER_TYPES:
        values = rng.integers(0, 100, 300).astype(t.to_pandas_dtype())
        for arr in (pa.array(values, t), received(pa.record_batch([pa.array(values, t)], names=["v"])).column(0)):
            for _ in range(20):
                a = int(rng.integers(0, 300))
                part = arr.slice(a, int(rng.integers(0, 301 - a)))
                got, want = numpy_view(part), part.to_numpy(zero_copy_only=True)
                assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True), (t, a)
                assert not got.flags.writeable
                if len(part):
                    assert got.ctypes.data == want.ctypes.data  # the same memory: no copy
    with_nulls = pa.array([1, None, 3], pa.int64())  # (and booleans, strings): to_numpy's own way
    assert np.array_equal(numpy_view(with_nulls), with_nulls.to_numpy(zero_copy_only=False), equal_nan=True)
    assert numpy_view(pa.array([True, False])).tolist() == [True, False]


_FIRST_BATCHES = """
import sys
from shardstream.client import Loader
for output, columns in (("arrow", None), ("numpy", ["id", "x", "label"])):
    with Loader([sys.argv[1]], "toy", batch_size=8, output=output, columns=columns, epochs=1) as loader:
        it = iter(loader)
        next(it), next(it)
        assert loader.last_batch.rows.dtype.name == "int64"
print(" ".join(m for m in ("pandas", "pyarrow.compute") if m in sys.modules))
"""


def test_a_fresh_client_reads_its_first_batches_without_importing_pandas(endpoints: list[str]) -> None:
    """pyarrow's to_numpy imports pandas where it is installed (~250-360 ms) and pandas imports
    pyarrow.compute: a fresh client, a restarted rank, paid both in its first batch (its provenance
    columns as numpy, and numeric columns for numpy/torch output)."""
    import importlib.util
    import subprocess
    import sys

    assert importlib.util.find_spec("pandas") is not None  # (the dev install has it: else this proves nothing)
    r = subprocess.run([sys.executable, "-c", _FIRST_BATCHES, endpoints[0]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [], f"a fresh client's first batches imported: {r.stdout.strip()}"
