"""Message buffers are reused only once nothing refers to them, and gathers into them are exact.

A buffer handed out again while a message still used it would change that message's rows under
it: the properties below keep messages alive in every way the server does (the Arrow array, a batch
and its slices, a numpy view) and check their bytes after many later gathers into the same pool.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from loadtest.previous_build import previous_gather
from shardstream.server.read import gather as gather_module
from shardstream.server.read.message_buffers import MessageBuffers


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[MessageBuffers]:
    """A small pool that takes buffers of any size, used by the gather."""
    buffers = MessageBuffers(1 << 20, min_bytes=0)
    monkeypatch.setattr(gather_module, "message_buffers", lambda: buffers)
    yield buffers


def test_a_buffer_in_use_is_not_handed_out_again() -> None:
    pool = MessageBuffers(8 << 20, min_bytes=0)
    first = pool.get(100_000)
    array = pa.Array.from_buffers(pa.uint8(), 100_000, [None, first])
    batch = pa.RecordBatch.from_arrays([array], names=["x"]).slice(10, 5)
    view = np.frombuffer(first, dtype=np.uint8)
    del first, array
    for holder in ("batch", "view"):
        again = pool.get(100_000)
        assert again.address != view.ctypes.data, f"reused while a {holder} held it"
        del again
        if holder == "batch":
            del batch
        else:
            del view
    assert pool.get(100_000) is not None and pool.reused >= 1


def test_the_pool_keeps_at_most_its_bytes_and_passes_other_sizes_through() -> None:
    pool = MessageBuffers(1 << 20, min_bytes=64 << 10)
    held = [pool.get(200_000) for _ in range(10)]  # more than fit: the rest are Arrow's
    assert pool.held_bytes <= 1 << 20
    assert all(b.size == 200_000 for b in held)
    small = pool.get(1000)
    large = pool.get(600_000)  # over a quarter of the pool
    assert small.size == 1000 and large.size == 600_000
    assert pool.held_bytes <= 1 << 20
    del held
    again = [pool.get(200_000) for _ in range(4)]
    assert pool.reused == 4 and len({b.address for b in again}) == 4


def _tables(rng: np.random.Generator, count: int) -> list[pa.Table]:
    tables = []
    for _ in range(count):
        rows = int(rng.integers(1, 40))
        tables.append(
            pa.table(
                {
                    "id": rng.integers(0, 1 << 40, rows, dtype=np.int64),
                    "x": pa.FixedSizeListArray.from_arrays(
                        pa.array(rng.random(rows * 5, dtype=np.float32)), 5
                    ),
                }
            )
        )
    return tables


def _draw(rng: np.random.Generator, tables: list[pa.Table], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows to gather: shuffled, or a few runs of consecutive rows (an unshuffled read)."""
    if rng.random() < 0.3:
        group, row = [], []
        while len(group) < n:
            g = int(rng.integers(len(tables)))
            start = int(rng.integers(tables[g].num_rows))
            k = min(n - len(group), tables[g].num_rows - start)
            group += [g] * k
            row += range(start, start + k)
        return np.array(group), np.array(row)
    group = rng.integers(0, len(tables), n)
    row = np.array([rng.integers(tables[g].num_rows) for g in group], dtype=np.int64)
    return group, row


@pytest.mark.parametrize("seed", range(20))
def test_gathers_into_reused_buffers_are_exact_and_leave_live_messages_alone(
    pool: MessageBuffers, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    tables = _tables(rng, int(rng.integers(1, 9)))
    kept: list[tuple[pa.Table | pa.RecordBatch, pa.Table]] = []
    for _ in range(30):
        group, row = _draw(rng, tables, int(rng.integers(1, 120)))
        got = gather_module._gather_fixed(tables, group, row)
        want = previous_gather(tables, group, row).combine_chunks()
        assert got is not None and got.equals(want)
        if rng.random() < 0.3:  # still in use, whole or as a slice of its batch: not to be written into
            k = int(rng.integers(got.num_rows))
            kept.append((got, want) if rng.random() < 0.5 else (got.to_batches()[0].slice(k), want.slice(k)))
        del got
    for got, want in kept:
        assert (
            pa.Table.from_batches([got]).equals(want) if isinstance(got, pa.RecordBatch) else got.equals(want)
        )
    assert pool.reused > 0  # the property was exercised on reused buffers
