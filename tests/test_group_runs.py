"""An unshuffled stream's messages cut from a row group leased once (build.py `_group_run`,
reader.py `GroupRun`) are the messages the general build makes of the same chunks, byte for byte
(header and Arrow IPC stream, `Message.wire()`), and what they hold adds up to what they keep alive.

Over random streams: row groups of 20 rows with shards of 70 (a short last row group per shard) and
of 64 with shards of 200; batch sizes odd and even (a slice of an odd number of 4-byte `_shard`
values is where the IPC writer would record another buffer length), world sizes 1-3, start
offsets, batch-size schedules with skipped ranges, message targets of one step to many, column
subsets, a version with masked rows (drop_rows), and a server cap that sends steps in parts.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadtest.previous_build import no_runs
from shardstream.ipc import ipc_size
from shardstream.provenance import expand
from shardstream.registry import Registry
from shardstream.server.backends.roots import open_registry
from shardstream.server.read import build as build_module
from shardstream.server.read.build import MessageBuilder
from shardstream.server.read.plan import ReadPlanner
from shardstream.server.read.reader import _Cut, new_row_group_cache
from shardstream.server.read.request_limits import RequestLimits
from shardstream.server.writing.drop_rows import drop_rows
from shardstream.server.writing.ingest import IngestOptions, ingest
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import write_dataset

COLUMNS = (["id", "x", "label"], ["id", "x", "label", "text"], ["x"], ["text"])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("group-runs") / "root"
    write_dataset(root, "small", 263, row_group_rows=20, shard_rows=70)
    write_dataset(root, "large", 500, row_group_rows=64, shard_rows=200)
    write_dataset(root, "masked", 300, row_group_rows=20, shard_rows=70)
    drop_rows(Registry(root), "masked", rows=[(0, 3), *((1, r) for r in range(20, 45)), (2, 69)])
    # rows of 264 bytes: a row group's cut (its provenance) is kept while the cache holds it
    ids = np.arange(256, dtype=np.int64)
    wide = pa.table({"id": ids, "v": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 64).astype(np.float32)), 64)})
    pq.write_table(wide, root.parent / "src-wide.parquet")
    ingest(root.parent / "src-wide.parquet", "wide", root, IngestOptions(row_group_rows=64, shard_rows=128, progress=False))
    return root


@pytest.fixture
def planner(root: Path) -> Iterator[ReadPlanner]:
    with open_registry(str(root)) as registry:
        yield ReadPlanner(registry, new_row_group_cache(64 << 20))


def _builds(planner: ReadPlanner, req: pb.ReadRequest) -> list[list[Any]]:
    return list(MessageBuilder().builds(planner.plan(req)))


def _request(rng: np.random.Generator, dataset: str) -> pb.ReadRequest:
    world = int(rng.integers(1, 4))
    req = pb.ReadRequest(
        dataset=dataset,
        world_size=world,
        rank=int(rng.integers(0, world)),
        batch_size=int(rng.integers(1, 30)),
        start_offset=int(rng.integers(0, 60)) if rng.random() < 0.5 else 0,
        columns=COLUMNS[int(rng.integers(0, len(COLUMNS)))],
        max_message_bytes=int(rng.choice([1, 300, 2_000, 20_000, 0])),
        epoch=int(rng.integers(0, 3)),
        split_steps=True,
    )
    req.shuffle.mode = "none"
    if rng.random() < 0.3:  # a batch-size ramp and a skipped range (schedules: another layout)
        req.batch_size = 0
        req.batch_schedule.add(start=0, batch_size=int(rng.integers(1, 9)))
        req.batch_schedule.add(start=int(rng.integers(20, 80)) * world, batch_size=int(rng.integers(1, 30)))
        a = int(rng.integers(0, 150))
        req.skip.add(start=a, end=a + int(rng.integers(1, 40)))
    return req


@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_runs_make_the_general_builds_bytes(
    planner: ReadPlanner, monkeypatch: pytest.MonkeyPatch, seed: int, cut: bool
) -> None:
    """`cut`: chunks cut at every row group's end (`_in_group`: these row groups are under
    CUT_MIN_BYTES), the general build's chunks cut alike (`no_runs`)."""
    if cut:
        monkeypatch.setattr(build_module, "CUT_MIN_BYTES", 0)
    rng = np.random.default_rng(seed)
    dataset = ("small", "large", "masked")[seed % 3]
    for _ in range(3):
        req = _request(rng, dataset)
        cold = _builds(planner, req)  # row groups read as the builds need them: one a build
        warm = _builds(planner, req)  # all held: a build goes on into the next row groups
        with monkeypatch.context() as m:
            m.setattr(MessageBuilder, "_group_run", no_runs)
            want = _builds(planner, req)
        assert all(len(b) == 1 for b in want)
        for got in (cold, warm):
            flat = [msg for b in got for msg in b]
            assert [msg.wire() for msg in flat] == [b[0].wire() for b in want], req
            assert [(msg.steps, msg.rows, msg.nbytes) for msg in flat] == [
                (b[0].steps, b[0].rows, b[0].nbytes) for b in want
            ]
            for built in got:  # each build holds at least what it sends; its last message some of it
                assert sum(msg.holds for msg in built) >= sum(msg.nbytes for msg in built)
                assert built[-1].holds >= built[-1].nbytes


@pytest.mark.parametrize("dataset", ["small", "large", "masked"])
def test_an_unshuffled_stream_is_cut_from_its_row_groups(planner: ReadPlanner, dataset: str) -> None:
    """The runs are taken (else the test above compares the general build with itself): with one
    rank and messages of 4 rows, a row group's messages are one build."""
    req = pb.ReadRequest(dataset=dataset, world_size=1, batch_size=4, max_message_bytes=1, columns=["id", "x"])
    got = _builds(planner, req)  # cold: a build stops at its row group's end (it never waits for a read)
    rows = [sum(msg.rows for msg in b) for b in got]
    assert sum(rows) == planner.plan(req).layout.num_rows
    assert max(len(b) for b in got) >= 5  # 20 rows (or 64) in messages of 4
    assert sum(len(b) > 1 for b in got) >= len(got) // 3  # (masked rows move where messages start)
    held = [msg.holds for b in got for msg in b[:-1]]
    assert held and not any(held)  # the row group is held by the build's last message
    if dataset == "masked":
        return  # (its messages of 4 rows straddle row groups after the first masked row)
    warm = _builds(planner, req)  # the cache holds them all: a build goes on into the next ones
    assert len(warm) < len(got)
    spans = [sum(msg.holds > 0 for msg in b) for b in warm]
    assert max(spans) == 2  # row groups a build holds: within what a stream reserves for it
    assert all(b[-1].holds > 0 for b in warm)


def _stream(planner: ReadPlanner, req: pb.ReadRequest) -> tuple[list[pb.StepInfo], pa.Table, list[Any]]:
    messages = [msg for b in _builds(planner, req) for msg in b]
    steps = [st for m in messages for st in m.header.steps]
    return steps, pa.Table.from_batches([m.batch for m in messages]), messages


@pytest.mark.parametrize("seed", range(30))
def test_chunks_cut_at_row_group_ends_carry_the_same_steps_and_rows(
    planner: ReadPlanner, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """A stream whose chunks are cut at row-group ends (`_in_group`) has the steps, rows,
    provenance and end of epoch of one whose chunks are not, only in other messages; where a
    rank's steps tile the row groups (one rank, batches dividing them) every message is a slice of
    one row group, cut from it, never gathered."""
    rng = np.random.default_rng(seed + 9_000)
    dataset = ("small", "large", "masked")[seed % 3]
    for _ in range(3):
        req = _request(rng, dataset)
        req.max_message_bytes = int(rng.choice([300, 2_000, 20_000, 1 << 30]))
        monkeypatch.setattr(build_module, "CUT_MIN_BYTES", 1 << 62)
        want_steps, want_rows, want = _stream(planner, req)
        monkeypatch.setattr(build_module, "CUT_MIN_BYTES", 0)
        got_steps, got_rows, got = _stream(planner, req)
        assert got_steps == want_steps, req
        assert got_rows.equals(want_rows), req
        assert got[-1].header.end_of_epoch == want[-1].header.end_of_epoch
        assert got[-1].header.dropped == want[-1].header.dropped
    if dataset == "masked":
        return
    group = 64 if dataset == "large" else 20  # rows a row group (a shard's last: fewer)
    req = pb.ReadRequest(dataset=dataset, world_size=1, batch_size=2 if dataset == "small" else 8, columns=["id", "x"])
    req.max_message_bytes = 1 << 30  # the epoch in one message, if not cut
    plan = planner.plan(req)
    monkeypatch.setattr(MessageBuilder, "build_batch", lambda *a: pytest.fail("a chunk was gathered"))
    for _ in range(2):  # cold (a build ends where the cache does) and warm
        _, _, messages = _stream(planner, req)
        for msg in messages:
            shards, rows = msg.batch.column("_shard").to_numpy(), msg.batch.column("_row").to_numpy()
            assert len(set(shards)) <= 1 and len(set(rows // group)) <= 1, (shards, rows)
        assert sum(m.rows for m in messages) == plan.layout.num_rows
        assert len(messages) == plan.readers[0].locator.num_groups + 1  # the first step alone, then a row group each


def test_a_shuffled_stream_is_built_a_message_at_a_time(planner: ReadPlanner) -> None:
    for mode in ("block", "full"):
        req = pb.ReadRequest(dataset="large", world_size=1, batch_size=4, max_message_bytes=1, seed=1)
        req.shuffle.mode = mode
        assert all(len(b) == 1 for b in _builds(planner, req))


def test_steps_over_the_cap_go_in_parts_the_general_way(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_registry(str(root)) as registry:
        capped = ReadPlanner(registry, new_row_group_cache(64 << 20), RequestLimits(max_message_bytes=1_500))
        req = pb.ReadRequest(dataset="large", world_size=1, batch_size=30, split_steps=True, columns=["id", "text"])
        got = _builds(capped, req)
        with monkeypatch.context() as m:
            m.setattr(MessageBuilder, "_group_run", no_runs)
            want = _builds(capped, req)
    flat = [msg for b in got for msg in b]
    assert any(msg.parts for msg in flat)
    assert [msg.wire() for msg in flat] == [b[0].wire() for b in want]


@pytest.mark.parametrize("bare", [False, True])
@pytest.mark.parametrize(("dataset", "columns"), [("large", ["id", "x"]), ("small", ["id", "x", "label"]), ("large", ["id", "text"])])
def test_a_run_sizes_each_slice_as_the_ipc_writer_does(
    planner: ReadPlanner, dataset: str, columns: list[str], bare: bool
) -> None:
    """`GroupRun.ipc_size` counts a slice once per (rows, first, last) where every column is
    fixed-width (its values cannot change the bytes), and sizes each slice itself otherwise: every
    slice of two row groups, at every start and length, twice (the second time from the counts);
    with the provenance columns and without (`bare`), which a cut counts apart."""
    reader = planner.plan(pb.ReadRequest(dataset=dataset, world_size=1, batch_size=4, columns=columns)).readers[0]
    rows = 64 if dataset == "large" else 20
    for group, start_row in ((0, 0), (1, rows)):
        if bare:  # (the same row group's full run first: its counts must not be taken for the bare one's)
            full = reader.group_run(0, group, start_row, columns)
            assert full is not None
            full.ipc_size(full.batch(0, 2), 0)
            full.release()
        run = reader.group_run(0, group, start_row, columns, bare=bare)
        assert run is not None
        try:
            assert (run._sizes is None) == ("text" in columns)
            assert ("_row" in run.batch(0, 1).schema.names) != bare
            for _ in range(2):
                for start in range(run.rows):
                    for n in range(1, run.rows - start + 1):
                        batch = run.batch(start, n)
                        assert run.ipc_size(batch, start) == ipc_size(batch), (start, n)
        finally:
            run.release()


def ids_of(n: int) -> pa.Array:
    return pa.array(np.arange(n, dtype=np.int64))


def test_a_row_groups_cut_is_made_once_while_the_cache_holds_it(root: Path) -> None:
    """Builds of the same cached row group cut messages from one table with provenance, kept while
    the table lives (its cache entry); a row group read anew gets a cut of its own. Rows under 192
    bytes (the provenance over 1/16 of them) get provenance columns each build; a bare run, none."""
    req = pb.ReadRequest(dataset="wide", world_size=1, batch_size=4, columns=["id", "v"])
    with open_registry(str(root)) as registry:
        planner = ReadPlanner(registry, new_row_group_cache(64 << 20))
        reader = planner.plan(req).readers[0]
        first, again = reader.group_run(0, 1, 64, ["id", "v"]), reader.group_run(0, 1, 64, ["id", "v"])
        assert first is not None and again is not None
        assert first._full is again._full
        assert first.batch(3, 5).equals(again.batch(3, 5))
        cut = first._full
        first.release()
        again.release()
        small = planner.plan(pb.ReadRequest(dataset="large", world_size=1, batch_size=4)).readers[0]
        runs = [small.group_run(0, 1, 64, ["id", "x"]) for _ in range(2)]
        assert runs[0] is not None and runs[1] is not None
        assert runs[0]._full is not runs[1]._full and runs[0]._full.equals(runs[1]._full)
        bare = [small.group_run(0, 1, 64, ["id", "x"], bare=True) for _ in range(2)]
        assert bare[0] is not None and bare[1] is not None
        assert bare[0]._full is bare[1]._full  # the row group as one batch (and its slices' sizes): kept
        for run in [*runs, *bare]:
            run.release()
    # a cut goes with its table
    table = pa.table({"id": ids_of(256), "v": pa.array([b"x" * 200] * 256, pa.binary(200))})
    kept = _Cut.of(table, 3, 1000)
    assert kept is not None and _Cut.of(table, 3, 1000) is kept and id(table) in _Cut._MADE
    assert _Cut.of(pa.concat_tables([table, table]), 3, 1000) is None  # (two chunks: not cut)
    assert _Cut.of(table, 4, 1000) is not kept  # (another shard's rows: never mistaken for it)
    key = id(table)
    del table
    gc.collect()
    assert key not in _Cut._MADE
    with open_registry(str(root)) as registry:
        other = ReadPlanner(registry, new_row_group_cache(64 << 20)).plan(req).readers[0]
        fresh = other.group_run(0, 1, 64, ["id", "v"])
        assert fresh is not None
        try:
            assert fresh._full is not cut
            assert fresh._full.equals(cut)
        finally:
            fresh.release()


def _bare(req: pb.ReadRequest) -> pb.ReadRequest:
    out = pb.ReadRequest()
    out.CopyFrom(req)
    out.provenance_in_header = True
    return out


def _without_provenance(header: pb.ReadHeader) -> pb.ReadHeader:
    out = pb.ReadHeader()
    out.CopyFrom(header)
    out.ClearField("provenance")
    return out


@pytest.mark.parametrize("seed", range(30))
def test_a_bare_stream_is_the_full_stream_with_the_provenance_in_its_headers(
    planner: ReadPlanner, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """ReadRequest.provenance_in_header: a stored-order stream's steps and rows are those the
    request without it gets, less the `_shard` and `_row` columns, with those rows' provenance in
    each message's header — cut from row groups cold and warm, built the general way, in parts —
    in fewer bytes. (Its messages may group steps otherwise: a stream sizes its next message by
    the bytes a sample took in the last.) A message cut from a row group is one run."""
    rng = np.random.default_rng(seed + 7_000)
    dataset = ("small", "large", "masked")[seed % 3]
    for _ in range(3):
        req = _request(rng, dataset)
        full = [msg for b in _builds(planner, req) for msg in b]
        want = pa.Table.from_batches([m.batch for m in full])
        with monkeypatch.context() as m:
            m.setattr(MessageBuilder, "_group_run", no_runs)
            general = [msg for b in _builds(planner, _bare(req)) for msg in b]
        for bare in ([msg for b in _builds(planner, _bare(req)) for msg in b], general):
            assert all(m.header.HasField("provenance") for m in bare), req
            steps = [st for m in bare for st in m.header.steps]
            assert steps == [st for m in full for st in m.header.steps], req
            assert _without_provenance(bare[-1].header).end_of_epoch == full[-1].header.end_of_epoch
            assert bare[-1].header.dropped == full[-1].header.dropped
            got = pa.Table.from_batches([m.batch for m in bare])
            assert got.equals(want.drop_columns(["_shard", "_row"]))
            provenance = [expand(m.header.provenance, m.batch.num_rows) for m in bare]
            np.testing.assert_array_equal(np.concatenate([p[0] for p in provenance]), want.column("_shard").to_numpy())
            np.testing.assert_array_equal(np.concatenate([p[1] for p in provenance]), want.column("_row").to_numpy())
            assert sum(m.nbytes for m in bare) <= sum(m.nbytes for m in full)  # (general builds: counted with the columns)
            assert sum(map(len, (w for m in bare for w in m.wire()))) < sum(map(len, (w for m in full for w in m.wire())))
    # one rank's unshuffled messages of one row group each: one run apiece
    req = pb.ReadRequest(dataset=dataset, world_size=1, batch_size=4, max_message_bytes=1, columns=["id", "x"])
    req.provenance_in_header = True
    for msg in [msg for b in _builds(planner, req) for msg in b]:
        if dataset != "masked" and msg.rows:
            assert len(msg.header.provenance.lengths) == 8, msg.header


def test_provenance_in_the_header_only_in_the_stored_order(planner: ReadPlanner) -> None:
    """Shuffled streams (and, by the same rule, transforms, balance and mixtures: ReadPlan.bare)
    keep the columns whatever the request asks: their rows are no runs to save bytes on."""
    for mode in ("block", "full"):
        req = pb.ReadRequest(dataset="large", world_size=2, batch_size=7, seed=3, provenance_in_header=True)
        req.shuffle.mode = mode
        assert not planner.plan(req).bare
        for msg in [msg for b in _builds(planner, req) for msg in b]:
            assert {"_shard", "_row"} <= set(msg.batch.schema.names)
            assert not msg.header.HasField("provenance")
    req = pb.ReadRequest(dataset="large", world_size=1, batch_size=4, provenance_in_header=True)
    assert planner.plan(req).bare
    req.provenance_in_header = False
    assert not planner.plan(req).bare
