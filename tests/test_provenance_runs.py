"""The provenance of a message's rows in its header (shardstream/provenance.py): `runs_of` and
`one_run` (the server's) and `expand` (the client's) give back every row's `_shard` and `_row`, in
order, for any rows — runs of consecutive rows of one shard, rows in any order, repeats, no rows —
in no more bytes than the two columns took; `expand` and `check` refuse a malformed or miscounted
one. The client's BatchInfo makes a batch's arrays only when they are read (client/batch.py)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.errors import DataLossError
from shardstream.provenance import check, expand, joined, one_run, runs_of
from shardstream.v1 import shardstream_pb2 as pb

# pieces of a message: (shard, first row, rows) runs, each possibly shuffled within itself
pieces = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 2**40), st.integers(1, 40), st.booleans()), max_size=12
)


def _rows(parts: list[tuple[int, int, int, bool]], seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shards, rows = [np.zeros(0, np.int32)], [np.zeros(0, np.int64)]
    for shard, first, n, shuffled in parts:
        r = np.arange(first, first + n, dtype=np.int64)
        rows.append(rng.permutation(r) if shuffled else r)
        shards.append(np.full(n, shard, np.int32))
    return np.concatenate(shards), np.concatenate(rows)


@settings(max_examples=300, deadline=None)
@given(pieces, st.integers(0, 2**31))
def test_runs_give_back_every_rows_provenance_in_no_more_bytes(parts: list[tuple[int, int, int, bool]], seed: int) -> None:
    shards, rows = _rows(parts, seed)
    p = runs_of(shards, rows)
    check(p, len(rows))
    with pytest.raises(DataLossError):
        check(p, len(rows) + 1)
    got_shards, got_rows = expand(pb.Provenance.FromString(p.SerializeToString()), len(rows))
    assert got_shards.dtype == np.int32 and got_rows.dtype == np.int64
    np.testing.assert_array_equal(got_shards, shards)
    np.testing.assert_array_equal(got_rows, rows)
    assert len(p.shards) + len(p.rows) + len(p.lengths) <= 12 * len(rows)  # the columns' bytes
    if p.lengths:  # runs: as few as there are maximal runs of consecutive rows of one shard
        breaks = np.count_nonzero((np.diff(rows) != 1) | (np.diff(shards) != 0))
        assert len(p.lengths) == 8 * (breaks + 1)
    # cut anywhere into parts (a step sent in parts), each part's runs joined: the whole again
    cuts = sorted(np.random.default_rng(seed).integers(0, len(rows) + 1, 3).tolist())
    bounds = [0, *cuts, len(rows)]
    parts = [runs_of(shards[a:b], rows[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    again = expand(joined(parts), len(rows))
    np.testing.assert_array_equal(again[0], shards)
    np.testing.assert_array_equal(again[1], rows)


def test_a_run_of_one_row_group_is_twenty_bytes() -> None:
    p = one_run(3, 10**12, 4096)
    assert len(p.shards) + len(p.rows) + len(p.lengths) == 20
    shards, rows = expand(p, 4096)
    assert (shards == 3).all() and (rows == np.arange(10**12, 10**12 + 4096)).all()
    assert runs_of(np.full(4096, 3, np.int32), np.arange(10**12, 10**12 + 4096)) == p


@pytest.mark.parametrize(
    ("p", "n", "says"),
    [
        (pb.Provenance(shards=b"\0\0\0", rows=bytes(8)), 1, "not whole values"),
        (pb.Provenance(shards=bytes(8), rows=bytes(8)), 1, "malformed"),
        (pb.Provenance(shards=bytes(4), rows=bytes(8), lengths=bytes(16)), 1, "malformed"),
        (pb.Provenance(shards=bytes(8), rows=bytes(16)), 3, "names 2 rows, the message has 3"),
        (one_run(0, 0, 5), 4, "names 5 rows, the message has 4"),
        (pb.Provenance(shards=bytes(8), rows=bytes(16), lengths=np.array([3, 0], "<i8").tobytes()), 3, "a run of no rows"),
        (pb.Provenance(), 2, "names 0 rows, the message has 2"),
    ],
)
def test_a_malformed_provenance_is_data_loss(p: pb.Provenance, n: int, says: str) -> None:
    """Whether made into arrays or only checked (the client checks each message as it comes, and
    makes a batch's arrays when they are read)."""
    with pytest.raises(DataLossError, match=says):
        expand(p, n)
    with pytest.raises(DataLossError, match=says):
        check(p, n)


def test_a_batch_makes_its_provenance_when_it_is_read() -> None:
    from shardstream.client.batch import RowProvenance

    made = []

    def make() -> tuple[np.ndarray, np.ndarray]:
        made.append(1)
        return expand(one_run(2, 100, 10), 10)

    lazy = RowProvenance(make, 3, 7)
    assert len(lazy) == 4 and not made
    shards, rows = lazy.arrays()
    assert made == [1] and (shards == 2).all() and rows.tolist() == [103, 104, 105, 106]
    assert lazy.arrays()[1] is rows and made == [1]
    assert lazy == RowProvenance.of(np.full(4, 2, np.int32), np.arange(103, 107))
    assert lazy != RowProvenance.of(np.full(4, 2, np.int32), np.arange(104, 108))
    again = pickle.loads(pickle.dumps(RowProvenance(make, 0, 10)))  # (as its arrays: no maker travels)
    assert again == RowProvenance.of(np.full(10, 2, np.int32), np.arange(100, 110)) and len(again) == 10
