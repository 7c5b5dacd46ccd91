"""The benchmarks' Flight baseline server (loadtest/flight_server.py): its shuffled orders, and its
`gather` stream, which serves every row once, in that order, in batches of --batch-rows rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest.bench import FlightProcess
from loadtest.flight_server import GATHER_TICKET, METADATA_BYTES, shuffled_order


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    window=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_block_order_permutes_rows_within_windows_of_row_groups(
    groups: list[int], window: int, seed: int
) -> None:
    order = shuffled_order(groups, "block", window, seed)
    assert sorted(order.tolist()) == list(range(sum(groups)))
    starts = np.concatenate([[0], np.cumsum(groups)])
    group_of = np.searchsorted(starts, order, side="right") - 1
    at = 0
    for w in range(0, len(groups), window):  # each window: every row of its row groups, no other
        k = min(window, len(groups) - w)
        members: set[int] = set()
        rows = 0
        size = 0
        while not (len(members) == k and rows == size):
            g = int(group_of[at + size])
            if g not in members:
                members.add(g)
                rows += groups[g]
            size += 1
            assert len(members) <= k and size <= rows
        at += size
    assert at == len(order)


@settings(max_examples=50, deadline=None)
@given(groups=st.lists(st.integers(1, 40), min_size=1, max_size=30), seed=st.integers(0, 2**32 - 1))
def test_a_full_order_is_a_permutation_of_every_row(groups: list[int], seed: int) -> None:
    order = shuffled_order(groups, "full", 4, seed)
    assert sorted(order.tolist()) == list(range(sum(groups)))


def test_an_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError, match="no shuffled order"):
        shuffled_order([3], "none", 4)


@pytest.mark.parametrize(("mode", "seed"), [("block", None), ("full", None), ("block", 7), ("full", 3)])
def test_the_gather_stream_serves_every_row_once_in_its_order(tmp_path: Path, mode: str, seed: int | None) -> None:
    """Each DoGet makes the order its ticket's seed names (default 0); fixed-width columns gathered
    by numpy, a binary one (encoded images) by Arrow's take."""
    rows, batch_rows = 1_000, 64
    ids = np.arange(rows, dtype=np.int64)
    vec = np.random.default_rng(1).random((rows, 3), dtype=np.float32)
    blob = pa.array([bytes([i % 251]) * (i % 7) for i in range(rows)], pa.binary())
    table = pa.table({"id": ids, "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), 3), "blob": blob})
    shards = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    pq.write_table(table.slice(0, 600), shards[0], row_group_size=100)  # 6 row groups
    pq.write_table(table.slice(600), shards[1], row_group_size=150)  # 150, 150, 100
    with FlightProcess(tmp_path, shards, batch_rows, from_memory=True) as server:
        client = flight.connect(f"grpc://127.0.0.1:{server.port}")
        try:
            ticket = f"{mode}:3" + ("" if seed is None else f":{seed}")
            reader = client.do_get(flight.Ticket(GATHER_TICKET + ticket.encode()))
            chunks = []
            while True:
                try:
                    chunks.append(reader.read_chunk())
                except StopIteration:
                    break
        finally:
            client.close()
    assert all(c.app_metadata is not None and c.app_metadata.size == METADATA_BYTES for c in chunks)
    assert [c.data.num_rows for c in chunks] == [batch_rows] * (rows // batch_rows) + [rows % batch_rows]
    got = pa.Table.from_batches([c.data for c in chunks])
    order = shuffled_order([100] * 6 + [150, 150, 100], mode, 3, seed or 0)
    if seed:
        assert not np.array_equal(order, shuffled_order([100] * 6 + [150, 150, 100], mode, 3))
    assert (np.diff(order) == 1).mean() < 0.1  # rows shuffled, not runs of their row groups
    assert got.equals(table.take(pa.array(order)))
