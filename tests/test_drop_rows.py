"""drop_rows: a version that masks rows without rewriting shards — the manifest's record (old fingerprints
unchanged), the lineage check, the plan over the rows held (property tests), and through a real server."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.client import Loader
from shardstream.errors import InvalidArgumentError
from shardstream.lineage import check_change, infer_change
from shardstream.manifest import Manifest, Shard
from shardstream.order.read_order import EpochOrder, RowLocator
from shardstream.order.schedule import merge_ranges
from shardstream.registry import Registry
from shardstream.server.writing.drop_rows import drop_rows

from .support.data import write_dataset


@st.composite
def masked_shards(draw):  # type: ignore[no-untyped-def]
    shards = draw(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=4), min_size=1, max_size=4))
    masks = []
    for groups in shards:
        n = sum(groups)
        rows = draw(st.lists(st.integers(0, max(0, n - 1)), max_size=n)) if n else []
        masks.append(merge_ranges((r, r + 1) for r in rows))
    return shards, masks


@settings(max_examples=300, deadline=None)
@given(case=masked_shards(), seed=st.integers(0, 3), mode=st.sampled_from(["none", "full", "block"]))
def test_the_plan_orders_exactly_the_rows_held(case, seed: int, mode: str) -> None:  # type: ignore[no-untyped-def]
    shards, masks = case
    plain = RowLocator(shards)
    loc = RowLocator(shards, masks)
    starts = np.cumsum([0] + [sum(g) for g in shards])
    held = [
        int(starts[s]) + r
        for s, groups in enumerate(shards)
        for r in range(sum(groups))
        if not any(a <= r < b for a, b in masks[s])
    ]
    assert loc.num_rows == len(held)
    assert loc.stored(np.arange(len(held))).tolist() == held
    if held:
        got = loc.locate(np.arange(len(held)))
        want = plain.locate(np.asarray(held))
        assert all((a == b).all() for a, b in zip(got, want, strict=True))
        # and back: (shard, row in shard) -> row index, -1 for a masked row
        assert loc.row_index(got[0], got[1]).tolist() == list(range(len(held)))
    masked_rows = [(s, r) for s, ms in enumerate(masks) for a, b in ms for r in range(a, b)]
    if masked_rows:
        s, r = zip(*masked_rows, strict=True)
        assert (loc.row_index(np.asarray(s), np.asarray(r)) == -1).all()
    # blocks are the rows held per row group, so an epoch's order is a permutation of them
    assert loc.block_sizes.sum() == len(held) and (loc.block_sizes > 0).all()
    if held:
        order = EpochOrder("fp", loc.block_sizes, seed, 0, mode).rows_in_range(0, len(held))
        assert sorted(order.tolist()) == list(range(len(held)))
    if not any(masks):
        assert loc.block_sizes.tolist() == plain.block_sizes.tolist() and loc.num_rows == plain.num_rows


@settings(max_examples=300, deadline=None)
@given(
    case=masked_shards(),
    uniform=st.integers(0, 5),  # > 0: every shard's row groups of this size (the divided lookup)
    masked=st.booleans(),
)
def test_a_run_is_where_locate_puts_each_of_its_rows(case, uniform: int, masked: bool) -> None:  # type: ignore[no-untyped-def]
    """`run(first, n)` (an unshuffled build's lookup, once a message) says what `locate` says of
    row `first` exactly when rows first .. first+n-1 are consecutive rows of one row group."""
    shards, masks = case
    if uniform:
        shards = [[uniform] * len(groups) for groups in shards]
        masks = [[(a, b) for a, b in m if b <= sum(groups)] for m, groups in zip(masks, shards, strict=True)]
    loc = RowLocator(shards, masks if masked else None)
    if not loc.num_rows:
        return
    shard, in_shard, group, in_group = loc.locate(np.arange(loc.num_rows))
    stored = loc.stored(np.arange(loc.num_rows))
    for first in range(loc.num_rows):
        for n in range(1, loc.num_rows - first + 1):
            rows = slice(first, first + n)
            one_group = (
                (shard[rows] == shard[first]).all()
                and (group[rows] == group[first]).all()
                and (np.diff(stored[rows]) == 1).all()
            )
            want = (int(shard[first]), int(group[first]), int(in_group[first]), int(in_shard[first]))
            got = loc.run(first, n)
            assert got == (want if one_group else None), (first, n)
            assert got is None or all(type(v) is int for v in got)
    assert loc.run(0, 0) is None and loc.run(-1, 1) is None and loc.run(loc.num_rows, 1) is None
    assert loc.run(0, loc.num_rows + 1) is None


def manifest(shards: tuple[Shard, ...], version: int = 1, schema=None) -> Manifest:  # type: ignore[no-untyped-def]
    import pyarrow as pa

    return Manifest("d", version, schema or pa.schema([("id", pa.int64())]), shards)


def test_masks_in_the_manifest_and_its_fingerprint() -> None:
    s = Shard("data/a.parquet", 10, 100, (5, 5), "ab" * 32)
    m = manifest((s,))
    assert "masked" not in json.dumps(m.to_json())  # an old manifest's JSON and fingerprint stay as they were
    masked = manifest((dataclasses.replace(s, masked=((2, 4), (7, 8))),))
    assert masked.num_rows == 7 and masked.masked_rows == 3 and masked.fingerprint != m.fingerprint
    back = Manifest.loads(masked.dumps())
    assert back == masked and back.fingerprint == masked.fingerprint
    for bad in (((4, 2),), ((0, 11),), ((1, 3), (3, 5)), ((5, 6), (1, 2))):
        with pytest.raises(InvalidArgumentError, match="masked rows"):
            dataclasses.replace(s, masked=bad)


def test_lineage_of_drop_rows() -> None:
    import pyarrow as pa

    s = Shard("data/a.parquet", 10, 100, (5, 5), "ab" * 32)
    parent = manifest((dataclasses.replace(s, masked=((1, 2),)),))
    child = manifest((dataclasses.replace(s, masked=((1, 3),)),), 2)
    check_change(parent, child, "drop_rows")
    assert infer_change(parent, child) == "drop_rows"
    for bad, why in (
        (manifest((dataclasses.replace(s, masked=((2, 3),)),), 2), "no longer masks rows 1:2"),
        (manifest((dataclasses.replace(s, masked=((1, 2),)),), 2), "masks no more rows"),
        (manifest((dataclasses.replace(s, sha256="cd" * 32, masked=((1, 4),)),), 2), "unchanged"),
        (manifest((dataclasses.replace(s, masked=((1, 3),)),), 2, pa.schema([("x", pa.int64())])), "field"),
    ):
        with pytest.raises(InvalidArgumentError, match=why):
            check_change(parent, bad, "drop_rows")
    # a column change keeps the rows masked
    wider = pa.schema([("id", pa.int64()), ("y", pa.int64())])
    with pytest.raises(InvalidArgumentError, match="masks rows none, the parent's 1:2"):
        check_change(
            parent, manifest((dataclasses.replace(s, uri="data/b.parquet"),), 2, wider), "add_columns"
        )


def test_drop_rows_through_a_server(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    m1 = write_dataset(root, "bad", 300, row_group_rows=20, shard_rows=70)
    reg = Registry(root)
    # by (shard, row): shard 1 (ids 80..159) row 5 is id 85; a whole row group; one by URI (id 240)
    res = drop_rows(
        reg, "bad", rows=[(1, 5), *((0, r) for r in range(20, 40)), (m1.shards[3].uri, 0)], reason="spike"
    )
    assert res.manifest.ref == "bad@2" and res.dropped == 22 and res.manifest.change == "drop_rows"
    assert res.manifest.metadata["drop_rows_reason"] == "spike"
    # by key values, from the command line; values already masked or held by no row are reported
    r = subprocess.run(
        [sys.executable, "-m", "shardstream", "datasets", "drop-rows", "bad", "--key", "id", "--values", "85,299,1000",
         "--root", str(root), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["dataset"] == "bad@3" and out["dropped"] == 1 and out["num_rows"] == 300 - 23
    assert out["values_not_found"] == ["85", "1000"]  # (85 is not a row of bad@2 any more)
    with pytest.raises(InvalidArgumentError, match="the 1 row"):
        drop_rows(reg, "bad", rows=[(1, 5)])
    with pytest.raises(InvalidArgumentError, match="latest version bad@3, not of bad@1"):
        drop_rows(reg, "bad@1", rows=[(0, 0)])
    gone = {85, 299, 240, *range(20, 40)}
    server = server_factory(root=root)
    for ref, want in (("bad@1", set(range(300))), ("bad@3", set(range(300)) - gone)):
        with Loader([server.target], ref, batch_size=16, shuffle="block", seed=3, epochs=2) as ld:
            ids = [i for b in ld for i in b["id"].tolist()]
        assert sorted(ids[: len(want)]) == sorted(want) and sorted(ids[len(want) :]) == sorted(want), ref
    # inspect --json output fed back: the samples of a step are dropped
    r = subprocess.run(
        [sys.executable, "-m", "shardstream", "inspect", "bad@3", "--batch-size", "4", "--step", "2", "--json",
         "--root", str(root)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    step = [s["id"] for s in json.loads(r.stdout)["samples"]]
    assert not set(step) & gone
    r = subprocess.run(
        [sys.executable, "-m", "shardstream", "datasets", "drop-rows", "bad", "--rows", "-", "--root", str(root)],
        input=r.stdout, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "bad@4", r.stderr
    with Loader([server.target], "bad@4", batch_size=50, shuffle="full") as ld:
        ids = sorted(i for b in ld for i in b["id"].tolist())
    assert ids == sorted(set(range(300)) - gone - set(step))
    assert Registry(root).resolve("bad@1").fingerprint == m1.fingerprint
