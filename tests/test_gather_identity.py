"""A stream's messages are byte-identical to those of the previous build path (issue #26).

The build path before issue #26 is the reference (loadtest/previous_build.py `previous_take`: Arrow's
take per row group, their concatenation, a reordering take; provenance appended, chunks combined). Every
message of a stream — header and Arrow IPC stream, `Message.wire()` — is compared against the same
stream built with the reference, in the three shuffle modes, with provenance, over fixed-width columns
(numpy's gather) and with a string column (Arrow's), in a mixture and through a transform, and in
the benchmark's row shapes (2,048-token rows, 16-token rows, encoded images).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from loadtest.previous_build import no_runs, previous_gather, previous_take
from shardstream.errors import DataLossError
from shardstream.ipc import ipc_bytes, ipc_size
from shardstream.order.read_order import RowLocator
from shardstream.server.backends.roots import open_registry
from shardstream.server.read import gather as gather_module
from shardstream.server.read.build import MessageBuilder
from shardstream.server.read.plan import ReadPlanner
from shardstream.server.read.reader import DatasetReader, new_row_group_cache
from shardstream.server.transforms.base import tensor_array
from shardstream.v1 import shardstream_pb2 as pb

from .support import media
from .support.data import write_dataset

N = 263  # prime: steps straddle row groups (20 rows) and shards (70 rows)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gather-identity") / "root"
    write_dataset(root, "toy", N, row_group_rows=20, shard_rows=70)
    write_dataset(root, "other", 101, row_group_rows=20, shard_rows=70, start=10_000)
    items = [(f"ok-{i}", media.random_png(i)) for i in range(10)]
    media.write_table(root, "imgs", media.blob_table("image", items), row_group_rows=4, shard_rows=8)
    # the benchmark's row shapes (loadtest/flight_bench.py SHAPES), small: token rows, tiny rows and
    # encoded image bytes of varying sizes
    rng = np.random.default_rng(7)
    for name, width, rows in (("tokens", 2048, 61), ("tiny", 16, 1009)):
        values = pa.array(rng.integers(0, 50_000, rows * width, dtype=np.int32))
        table = pa.table({"tokens": pa.FixedSizeListArray.from_arrays(values, width)})
        media.write_table(root, name, table, row_group_rows=rows // 5, shard_rows=rows // 2)
    blobs = [(f"img-{i}", rng.bytes(int(rng.integers(1_000, 6_000)))) for i in range(83)]
    media.write_table(root, "encoded", media.blob_table("image", blobs), row_group_rows=9, shard_rows=30)
    return root


@pytest.fixture
def planner(root: Path) -> Iterator[ReadPlanner]:
    with open_registry(str(root)) as registry:
        yield ReadPlanner(registry, new_row_group_cache(64 << 20))


def _request(dataset: str, mode: str, **fields: Any) -> pb.ReadRequest:
    transforms = fields.pop("transforms", ())
    req = pb.ReadRequest(dataset=dataset, world_size=1, **fields)
    req.shuffle.mode = mode
    req.shuffle.window = 3
    for op, params in transforms:
        req.transforms.add(op=op, params_json=params)
    return req


def _wire(planner: ReadPlanner, req: pb.ReadRequest) -> list[tuple[bytes, bytes]]:
    return [m.wire() for m in MessageBuilder().messages(planner.plan(req))]


def _same_as_reference(planner: ReadPlanner, monkeypatch: pytest.MonkeyPatch, req: pb.ReadRequest) -> None:
    got = _wire(planner, req)
    with monkeypatch.context() as m:
        m.setattr(DatasetReader, "take", previous_take)
        m.setattr(MessageBuilder, "_group_run", no_runs)  # every message by take
        want = _wire(planner, req)
    assert len(got) == len(want) > 1
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a == b, f"message {i} differs"


@pytest.mark.parametrize("mode", ["none", "block", "full"])
@pytest.mark.parametrize(
    "columns",
    [["id", "x", "label"], ["x"], ["id", "x", "label", "text"]],
    ids=["fixed-width", "one-list", "with-strings"],
)
@pytest.mark.parametrize("batch_size", [7, 40])
def test_a_stream_is_byte_identical_to_the_reference(
    planner: ReadPlanner, monkeypatch: pytest.MonkeyPatch, mode: str, columns: list[str], batch_size: int
) -> None:
    for rank in range(2):
        req = _request("toy", mode, seed=5, epoch=1, batch_size=batch_size, columns=columns)
        req.world_size, req.rank = 2, rank
        _same_as_reference(planner, monkeypatch, req)


@pytest.mark.parametrize("mode", ["none", "block", "full"])
@pytest.mark.parametrize(("dataset", "column", "batch_size"), [("tokens", "tokens", 5), ("tiny", "tokens", 64), ("encoded", "image", 8)])
def test_every_benchmark_shape_is_byte_identical_to_the_reference(
    planner: ReadPlanner, monkeypatch: pytest.MonkeyPatch, mode: str, dataset: str, column: str, batch_size: int
) -> None:
    """Token rows (fixed-size lists of 2,048 int32), tiny rows (16) and encoded images (binary)."""
    for rank in range(2):
        req = _request(dataset, mode, seed=11, epoch=0, batch_size=batch_size, columns=[column])
        req.world_size, req.rank = 2, rank
        _same_as_reference(planner, monkeypatch, req)


@pytest.mark.parametrize("mode", ["none", "block", "full"])
def test_a_mixture_is_byte_identical_to_the_reference(
    planner: ReadPlanner, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    req = _request("", mode, seed=3, batch_size=16, columns=["id", "x"], mixture_block=8)
    for name, weight in (("toy", 2.0), ("other", 1.0)):
        req.mixture.add(dataset=name, weight=weight)
    _same_as_reference(planner, monkeypatch, req)


@pytest.mark.parametrize("mode", ["none", "full"])
def test_a_transformed_stream_is_byte_identical_to_the_reference(
    planner: ReadPlanner, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    req = _request(
        "imgs",
        mode,
        seed=2,
        batch_size=3,
        columns=["image"],
        transforms=[("image.decode", '{"size": [4, 4]}')],
    )
    _same_as_reference(planner, monkeypatch, req)


def test_the_numpy_gather_serves_fixed_width_columns() -> None:
    """The fast path is the one taken for fixed-width columns (else the test above proves little)."""
    t = pa.table(
        {
            "id": np.arange(10, dtype=np.int64),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(30, dtype=np.float32)), 3),
        }
    )
    group, row = np.array([1, 0, 1, 0]), np.array([3, 9, 0, 2])
    fast = gather_module._gather_fixed([t, t.slice(2)], group, row)
    assert fast is not None
    assert fast.equals(previous_gather([t, t.slice(2)], group, row).combine_chunks())
    with_nulls = t.set_column(0, "id", pa.array([None, *range(1, 10)], type=pa.int64()))
    assert gather_module._gather_fixed([with_nulls, t], group, row) is None


def test_the_numpy_gather_takes_row_groups_of_one_schema_only() -> None:
    """Row groups whose schemas differ (a type, or metadata alone) are left to Arrow's path, however
    their views were found before (the views of a table are remembered by its id)."""
    a = pa.table({"id": np.arange(10, dtype=np.int64)})
    b = pa.table({"id": np.arange(10, 20, dtype=np.int64)})
    other_metadata = b.replace_schema_metadata({"k": "v"})
    other_type = pa.table({"id": np.arange(10, dtype=np.int32)})
    group, row = np.array([1, 0, 1, 0]), np.array([3, 9, 0, 2])
    for _ in range(2):  # the second time, every table's views are remembered
        fast = gather_module._gather_fixed([a, b], group, row)
        assert fast is not None and fast.column("id").to_pylist() == [13, 9, 10, 2]
        assert gather_module._gather_fixed([a, other_metadata], group, row) is None
        assert gather_module._gather_fixed([other_type, a], group, row) is None
        assert gather_module._gather_fixed([b, b, other_type], np.array([2]), np.array([0])) is None


def test_fixed_shape_tensors_take_the_numpy_gather_and_make_the_same_bytes() -> None:
    """Decoded images as the feature cache keeps them (fixed-shape tensors: an extension type over a
    fixed-size list) are gathered by numpy too, from whole and sliced row groups, into the bytes
    Arrow's take makes."""
    rng = np.random.default_rng(0)
    tables = [
        pa.table(
            {
                "image": tensor_array(rng.integers(0, 255, (12, 4, 4, 3), dtype=np.uint8)),
                "label": pa.array(np.arange(12, dtype=np.int64) + 100 * k),
            }
        )
        for k in range(3)
    ]
    tables[1] = tables[1].slice(2, 9)
    group = rng.integers(0, 3, 40)
    row = np.array([rng.integers(0, tables[g].num_rows) for g in group])
    fast = gather_module._gather_fixed(tables, group, row)
    assert fast is not None
    want = previous_gather(tables, group, row).combine_chunks()
    assert fast.schema == want.schema and fast.equals(want)
    assert ipc_bytes(fast.to_batches()[0]) == ipc_bytes(want.to_batches()[0])


@pytest.mark.parametrize("seed", range(20))
def test_rows_gathered_with_their_provenance_in_one_batch_are_those_appended_after(seed: int) -> None:
    """`gather_with` (a shuffled message's rows and provenance in one batch, on a schema made once)
    gives the batch, schema metadata and IPC bytes of a gather with the columns appended after it;
    and None where a column holds nulls."""
    rng = np.random.default_rng(seed)
    meta = {b"origin": b"test"}
    tables = [
        pa.table(
            {
                "image": tensor_array(rng.integers(0, 255, (10, 2, 3, 3), dtype=np.uint8)),
                "x": pa.array(rng.random(10, dtype=np.float32)),
            }
        ).replace_schema_metadata(meta)
        for _ in range(int(rng.integers(1, 5)))
    ]
    n = int(rng.integers(0, 30))
    group = rng.integers(0, len(tables), n)
    row = rng.integers(0, 10, n)
    fields = (pa.field("_shard", pa.int32()), pa.field("_row", pa.int64()))
    columns = [pa.array(rng.integers(0, 9, n), pa.int32()), pa.array(rng.integers(0, 99, n), pa.int64())]
    got = gather_module.gather_with(tables, group, row, fields, columns)
    assert got is not None
    want = gather_module.gather(tables, group, row)
    want = pa.Table.from_arrays([*want.columns, *columns], schema=pa.schema([*want.schema, *fields], metadata=meta))
    want_batch = want.combine_chunks().to_batches()[0] if n else pa.RecordBatch.from_pylist([], schema=want.schema)
    assert got.schema.equals(want_batch.schema, check_metadata=True)
    assert ipc_bytes(got) == ipc_bytes(want_batch)
    with_nulls = [pa.table({"s": pa.array(["a", None])})]  # (Arrow's path gathers it)
    one = [pa.array([0], pa.int32()), pa.array([1], pa.int64())]
    assert gather_module.gather_with(with_nulls, np.zeros(1, np.int64), np.ones(1, np.int64), fields, one) is None


def test_ipc_size_counts_the_stream_ipc_bytes_writes() -> None:
    n = 50
    ids = np.arange(n, dtype=np.int64)
    table = pa.table(
        {
            "id": ids,
            "x": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float32)), 3),
            "maybe": pa.array([None if i % 3 else i for i in range(n)], type=pa.int32()),
            "text": pa.array([f"sample-{i}" * (i % 4) for i in range(n)]),
            "tags": pa.array([[str(i)] * (i % 3) for i in range(n)]),
            "kind": pa.array([str(i % 3) for i in range(n)]).dictionary_encode(),
            "nested": pa.array([{"a": i, "b": [float(i)]} for i in range(n)]),
        }
    ).replace_schema_metadata({"k": "v"})
    # the same columns under other schema metadata in turn: a schema's part is counted once per
    # schema (ipc._framing), and a schema that differs in its metadata alone is another schema
    for metadata in ({"k": "v"}, {"k": "a longer value " * 9}, None, {"k": "v"}):
        for cols in (["id", "x"], ["id", "maybe", "text"], ["tags", "nested"], ["kind", "id"]):
            selected = table.select(cols).replace_schema_metadata(metadata)
            for start, length in ((0, n), (7, 20), (13, 1), (5, 0)):
                batch = selected.slice(start, length).combine_chunks().to_batches()
                batch = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=selected.schema)
                assert ipc_size(batch) == ipc_bytes(batch).size, (metadata, cols, start, length)


@pytest.mark.parametrize("seed", range(6))
def test_a_run_of_rows_is_located_by_its_first_as_locate_says(seed: int) -> None:
    """RowLocator.run (the unshuffled fast path) agrees with locate, masks (drop_rows) included."""
    rng = np.random.default_rng(seed)
    groups = [[int(x) for x in rng.integers(0, 9, rng.integers(1, 4))] for _ in range(rng.integers(1, 5))]
    masked = None
    if seed % 2:
        masked = []
        for gs in groups:
            total = sum(gs)
            a = int(rng.integers(0, total + 1))
            masked.append([(a, min(total, a + int(rng.integers(0, 4))))] if total else [])
    loc = RowLocator(groups, masked)
    for first in range(loc.num_rows):
        for n in range(1, loc.num_rows - first + 1):
            shard, row_in_shard, group, row_in_group = loc.locate(np.arange(first, first + n))
            one = (
                (shard == shard[0]).all() and (group == group[0]).all() and (np.diff(row_in_group) == 1).all()
            )
            want = (int(shard[0]), int(group[0]), int(row_in_group[0]), int(row_in_shard[0])) if one else None
            assert loc.run(first, n) == want, (groups, masked, first, n)


@pytest.mark.parametrize("seed", range(10))
def test_the_row_groups_of_a_message_are_found_as_np_unique_finds_them(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    from shardstream.server.read import reader as reader_module

    rng = np.random.default_rng(seed)
    groups = int(rng.integers(1, 300))
    g = rng.integers(0, groups, int(rng.integers(1, 3000)))
    want = np.unique(g, return_inverse=True)
    for dense_up_to in (1 << 16, 0):  # marked in an array, or np.unique's sort for many row groups
        monkeypatch.setattr(reader_module, "_DENSE_UNIQUE_GROUPS", dense_up_to)
        unique, inverse = reader_module._unique(g, groups)
        assert np.array_equal(unique, want[0]) and np.array_equal(inverse, want[1])


_FIRST_MESSAGES = """
import sys
from shardstream.server.backends.roots import open_registry
from shardstream.server.read.build import MessageBuilder
from shardstream.server.read.plan import ReadPlanner
from shardstream.server.read.reader import new_row_group_cache
from shardstream.v1 import shardstream_pb2 as pb
with open_registry(sys.argv[1]) as registry:
    planner = ReadPlanner(registry, new_row_group_cache(64 << 20))
    for mode in ("block", "full"):
        req = pb.ReadRequest(dataset="d", world_size=1, batch_size=16, split_steps=True, columns=sys.argv[2:])
        req.shuffle.mode = mode
        assert next(iter(MessageBuilder().stream(planner.plan(req)))).rows == 16
print(" ".join(m for m in ("pandas", "pyarrow.compute") if m in sys.modules))
"""


@pytest.mark.parametrize("columns", [["id", "x", "label"], ["id", "text"]])
def test_a_fresh_process_builds_its_first_shuffled_messages_without_importing_pandas(
    tmp_path: Path, columns: list[str]
) -> None:
    """pyarrow imports pandas, where it is installed, at its first `pa.array` of a numpy array or
    `to_numpy` (~250-360 ms), and pyarrow.compute at its first compute call such as a fixed-size
    list's `flatten` (~35 ms): a fresh server's first shuffled message paid both (291 ms to a first
    batch against ~15 later). The gather makes its arrays from buffers instead; Arrow's take (any
    column type) still loads pyarrow.compute, not pandas."""
    import importlib.util
    import subprocess
    import sys

    assert importlib.util.find_spec("pandas") is not None  # (the dev install has it: else this proves nothing)
    write_dataset(tmp_path / "root", "d", 300, row_group_rows=40, shard_rows=120)
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_MESSAGES, str(tmp_path / "root"), *columns],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()
    assert "pandas" not in out
    if "text" not in columns:
        assert "pyarrow.compute" not in out  # fixed-width columns: numpy or C gathers them


@pytest.mark.parametrize("scale", [1, 20])  # short runs (index arrays) and long ones (a slice copy a run)
@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_gather_spans_takes_exactly_the_asked_values(seed: int, large: bool, scale: int) -> None:
    """gather_spans (a balanced packed step's reader) against Python slicing of the same lists: any
    rows of several row groups (some sliced: an offset into their values), spans past a list's end
    clipped, empty spans and lists."""
    rng = np.random.default_rng(seed)
    t = pa.large_list(pa.int32()) if large else pa.list_(pa.int32())
    lists = []
    tables = []
    for _ in range(int(rng.integers(1, 5))):
        rows = [rng.integers(0, 1000, int(rng.integers(0, 30 * scale))).astype(np.int32).tolist() for _ in range(int(rng.integers(1, 12)))]
        skip = int(rng.integers(0, len(rows)))
        table = pa.table({"x": pa.array(rows, t), "y": pa.array(np.arange(len(rows)))}).slice(skip)
        if seed % 2 and table.num_rows > 1:  # a table of two chunks
            table = pa.concat_tables([table.slice(0, 1), table.slice(1)])
        tables.append(table)
        lists.append(rows[skip:])
    n = int(rng.integers(0, 40))
    group = rng.integers(0, len(tables), n)
    row = np.array([rng.integers(0, len(lists[g])) for g in group], dtype=np.int64)
    start = rng.integers(0, 35 * scale, n)
    stop = start + rng.integers(0, 35 * scale, n)
    got = gather_module.gather_spans(tables, group, row, "x", start, stop)
    assert got is not None and got.type == t
    assert got.to_pylist() == [lists[g][r][a:b] for g, r, a, b in zip(group, row, start, stop, strict=True)]
    assert gather_module.gather_spans(tables, group, row, "y", start, stop) is None  # not a list: gathered whole
    holed = [pa.table({"x": pa.array([[1, None, 3]], t)})]  # a null token: refused, not read around
    with pytest.raises(DataLossError, match="null value inside a list"):
        gather_module.gather_spans(holed, np.zeros(1, np.int64), np.zeros(1, np.int64), "x", np.zeros(1), np.ones(1))


@pytest.mark.parametrize("seed", range(40))
def test_binary_and_string_rows_gathered_in_one_copy_are_arrows_take(seed: int) -> None:
    """Variable-width columns (binary, string, their large forms; empty values; row groups sliced)
    beside fixed-width ones are gathered by numpy into the arrays Arrow's take makes, from any number
    of row groups in any order; short values by index arrays, long ones a slice copy each."""
    rng = np.random.default_rng(seed)
    long_values = bool(seed % 2)  # ~100 B a value: slice copies; else a few bytes: index arrays
    tables = []
    for _ in range(int(rng.integers(1, 6))):
        n = int(rng.integers(1, 15))
        sizes = rng.integers(0, 200 if long_values else 6, n)
        blobs = [bytes(rng.integers(0, 256, int(k), dtype=np.uint8)) for k in sizes]
        t = pa.table(
            {
                "blob": pa.array(blobs, pa.binary()),
                "text": pa.array([b.hex() for b in blobs], pa.string()),
                "big": pa.array(blobs, pa.large_binary()),
                "name": pa.array([f"r{i}" for i in range(n)], pa.large_string()),
                "x": pa.array(rng.random(n)),
            }
        )
        if n > 2 and rng.random() < 0.5:
            t = t.slice(1, n - 2)
        tables.append(t)
    m = int(rng.integers(0, 40))
    group = rng.integers(0, len(tables), m)
    row = np.array([rng.integers(0, tables[g].num_rows) for g in group], dtype=np.int64)
    got = gather_module._gather_fixed(tables, group, row)
    assert got is not None
    want = previous_gather(tables, group, row).combine_chunks()
    assert got.schema == want.schema and got.equals(want)
    if m:
        assert ipc_bytes(got.combine_chunks().to_batches()[0]) == ipc_bytes(want.to_batches()[0])
