"""The C kernels (shardstream/_kernels.c) give their numpy twins' results bit for bit.

- `feistel_walk` against `KeyedPermutation._walk_numpy`: permutation sizes from 1 to 2**62 - 1
  (around powers of 4, where the walk is longest), random keys, forward and inverse, and the
  inverse undoing the permutation;
- `gather_rows` against `gather._take_across_numpy`: row widths of 1 byte to 4 KiB, 1 to 40 row
  groups of random lengths, random rows;
- `locate_rows` and `unique_groups` against `RowLocator.locate_groups` and `reader._unique` on
  numpy (and np.unique): layouts of row groups of one size and of any sizes, empty ones, masks;
- a whole shuffled stream (block and full, with provenance) built with each, `Message.wire()`
  compared;
- wrong input is an error, never a read outside a row group.

The dev install (`make setup`) builds the module: a missing compiler fails `test_the_module_is_built`
rather than letting the rest compare numpy with itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shardstream import kernels
from shardstream.order.permutation import KeyedPermutation
from shardstream.order.read_order import RowLocator
from shardstream.server.backends.roots import open_registry
from shardstream.server.read import gather as gather_module
from shardstream.server.read import reader as reader_module
from shardstream.server.read.build import MessageBuilder
from shardstream.server.read.plan import ReadPlanner
from shardstream.server.read.reader import new_row_group_cache
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import write_dataset

native = kernels.native


def test_the_module_is_built() -> None:
    assert native is not None, kernels.describe()
    assert kernels.describe() == "native kernels"


def _sizes(rng: np.random.Generator) -> list[int]:
    edges = [1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 4**10 - 1, 4**10, 4**10 + 1, 4**30 + 7, (1 << 62) - 1]
    return edges + [int(rng.integers(1, 10**6)), int(rng.integers(1, 10**15))]


@pytest.mark.parametrize("seed", range(6))
def test_the_permutation_is_the_numpy_walks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in _sizes(rng):
        perm = KeyedPermutation(n, rng.bytes(32))
        positions = np.arange(n) if n <= 4096 else rng.integers(0, n, 3000, dtype=np.int64)
        forward = perm(positions)
        assert forward.dtype == np.int64
        assert np.array_equal(forward, perm._walk_numpy(positions, perm._encrypt)), n
        back = perm.inverse(forward)
        assert np.array_equal(back, perm._walk_numpy(forward, perm._decrypt)), n
        assert np.array_equal(back, positions), n
        if n <= 4096:
            assert np.array_equal(np.sort(forward), positions)  # a bijection of [0, n)


def test_positions_outside_the_permutation_are_an_index_error() -> None:
    perm = KeyedPermutation(100, b"k")
    for bad in ([100], [-1], [5, 2**40]):
        with pytest.raises(IndexError, match=r"\[0, 100\)"):
            perm(np.array(bad))
        with pytest.raises(IndexError, match=r"\[0, 100\)"):
            perm._walk_numpy(np.array(bad), perm._encrypt)
    assert perm(np.array([], dtype=np.int64)).size == 0


def test_the_walk_checks_its_arguments() -> None:
    keys = np.arange(6, dtype=np.uint64).tobytes()
    x = np.arange(4, dtype=np.int64)
    with pytest.raises(ValueError, match="items"):
        native.feistel_walk(x, np.empty(3, np.int64), 10, 2, keys, False)
    with pytest.raises(ValueError, match="does not cover"):
        native.feistel_walk(x, np.empty_like(x), 17, 2, keys, False)  # 4 bits cover 16
    with pytest.raises(ValueError, match="round keys"):
        native.feistel_walk(x, np.empty_like(x), 10, 2, b"", False)
    with pytest.raises(ValueError, match="not C-contiguous"):
        native.feistel_walk(x, np.empty(8, np.int64)[::2], 10, 2, keys, False)
    frozen = np.empty_like(x)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        native.feistel_walk(x, frozen, 10, 2, keys, False)


def _row_groups(rng: np.random.Generator, width: int) -> list[np.ndarray]:
    dtype = np.dtype((np.void, width))
    return [
        np.frombuffer(rng.bytes(int(rng.integers(1, 300)) * width), dtype=dtype)
        for _ in range(int(rng.integers(1, 41)))
    ]


@pytest.mark.parametrize("seed", range(10))
def test_the_gather_is_the_numpy_take(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for width in (1, 3, 8, 1032, 4096):
        views = _row_groups(rng, width)
        addresses = np.array([v.ctypes.data for v in views], dtype=np.int64)
        n = int(rng.integers(0, 700))
        group = rng.integers(0, len(views), n)
        row = np.array([rng.integers(0, len(views[g])) for g in group], dtype=np.int64)
        got = np.empty(n, dtype=views[0].dtype)
        want = np.empty(n, dtype=views[0].dtype)
        gather_module._take_across(views, addresses, group, row, got)
        gather_module._take_across_numpy(views, addresses, group, row, want)
        assert got.tobytes() == want.tobytes()
        assert all(
            got[i].tobytes() == views[g][r].tobytes() for i, (g, r) in enumerate(zip(group, row, strict=True))
        )


def test_the_gather_never_reads_outside_a_row_group() -> None:
    rng = np.random.default_rng(0)
    views = [np.frombuffer(rng.bytes(10 * 8), dtype=np.dtype((np.void, 8))) for _ in range(3)]
    addresses = np.array([v.ctypes.data for v in views], dtype=np.int64)
    lengths = np.full(3, 10, dtype=np.int64)
    out = np.empty(2 * 8, dtype=np.uint8)
    for group, row, what in (
        ([0, 3], [1, 1], "row group 3"),
        ([0, 2], [1, 10], "row 10"),
        ([-1, 0], [0, 0], "row group -1"),
    ):
        with pytest.raises(IndexError, match=what):
            native.gather_rows(out, 8, addresses, lengths, np.array(group, np.int64), np.array(row, np.int64))
    with pytest.raises(ValueError, match="out has"):
        native.gather_rows(out[:-1], 8, addresses, lengths, np.zeros(2, np.int64), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="differ in length"):
        native.gather_rows(out, 8, addresses, lengths[:2], np.zeros(2, np.int64), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="width"):
        native.gather_rows(out, 0, addresses, lengths, np.zeros(2, np.int64), np.zeros(2, np.int64))


def _layout(rng: np.random.Generator) -> list[list[int]]:
    """Shards of row groups: one size (the division), or any sizes (the binary search), empties too."""
    size = int(rng.integers(1, 50))
    uniform = rng.random() < 0.5
    return [
        [size if uniform else int(rng.integers(0, 60)) for _ in range(int(rng.integers(0, 6)))]
        for _ in range(int(rng.integers(1, 6)))
    ]


@pytest.mark.parametrize("seed", range(40))
def test_locating_rows_is_the_numpy_locate(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = np.random.default_rng(seed)
    groups = _layout(rng)
    masked = None
    if rng.random() < 0.3 and sum(map(sum, groups)) > 2:  # a drop_rows version: rows of the files skipped
        masked = [[(0, min(2, sum(groups[0])))] if sum(groups[0]) else [] for _ in groups[:1]] + [
            [] for _ in groups[1:]
        ]
    loc = RowLocator(groups, masked)
    if not loc.num_rows:
        return
    rows = rng.integers(0, loc.num_rows, int(rng.integers(1, 500)))
    if rng.random() < 0.3:
        rows = np.arange(loc.num_rows)
    got = loc.locate_groups(rows)
    with monkeypatch.context() as m:
        m.setattr(kernels, "native", None)
        want = loc.locate_groups(rows)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b), (groups, masked)
    g = got[0]
    unique, inverse = reader_module._unique(g, loc.num_groups)
    with monkeypatch.context() as m:
        m.setattr(kernels, "native", None)
        want_unique, want_inverse = reader_module._unique(g, loc.num_groups)
    np_unique, np_inverse = np.unique(g, return_inverse=True)
    for a, b in ((unique, want_unique), (unique, np_unique), (inverse, want_inverse), (inverse, np_inverse)):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_locating_checks_its_rows() -> None:
    loc = RowLocator([[10, 10], [5]])
    starts, shard_of, shard_starts = loc._group_starts, loc._group_shard, loc._shard_starts
    outs = [np.empty(2, np.int64), np.empty(2, np.int32), np.empty(2, np.int64), np.empty(2, np.int64)]
    with pytest.raises(IndexError, match=r"row 25 is outside \[0, 25\)"):
        native.locate_rows(np.array([3, 25]), starts, 0, shard_of, shard_starts, *outs)
    with pytest.raises(ValueError, match="stored 3"):
        native.locate_rows(np.array([3, 4, 5]), starts, 0, shard_of, shard_starts, *outs)
    with pytest.raises(IndexError, match="value 7 is outside"):
        native.unique_groups(np.array([1, 7]), 3, np.empty(2, np.int64), np.empty(2, np.int64))
    with pytest.raises(ValueError, match="as long as"):
        native.unique_groups(np.array([1, 2]), 3, np.empty(1, np.int64), np.empty(2, np.int64))


@pytest.fixture(scope="module")
def planner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadPlanner]:
    root = tmp_path_factory.mktemp("kernels") / "root"
    write_dataset(root, "toy", 499, row_group_rows=20, shard_rows=70)
    with open_registry(str(root)) as registry:
        yield ReadPlanner(registry, new_row_group_cache(64 << 20))


@pytest.mark.parametrize("mode", ["block", "full"])
@pytest.mark.parametrize("seed", range(4))
def test_a_shuffled_stream_is_the_same_either_way(
    planner: ReadPlanner, monkeypatch: pytest.MonkeyPatch, mode: str, seed: int
) -> None:
    req = pb.ReadRequest(
        dataset="toy",
        world_size=1 + seed % 3,
        rank=seed % (1 + seed % 3),
        batch_size=12 + seed * 5,
        seed=seed,
        epoch=seed,
        columns=["id", "x"],
        max_message_bytes=1 + seed * 700,
    )
    req.shuffle.mode = mode
    req.shuffle.window = 2 + seed * 2

    def wire() -> list[bytes]:
        return [m.wire() for b in MessageBuilder().builds(planner.plan(req)) for m in b]

    calls: list[str] = []

    class Counted:  # the C module, its calls counted: the stream must go through both kernels
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            def call(*args):  # type: ignore[no-untyped-def]
                calls.append(name)
                return getattr(native, name)(*args)

            return call

    with monkeypatch.context() as m:
        m.setattr(kernels, "native", Counted())
        with_c = wire()
        m.setattr(kernels, "native", None)
        with_numpy = wire()
    assert len(with_c) > 3
    assert {"feistel_walk", "gather_rows"} <= set(calls)
    assert with_c == with_numpy


def test_numpy_runs_where_told_and_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "SHARDSTREAM_NATIVE": "0"}
    code = "from shardstream import kernels; print(kernels.native is None, kernels.describe())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True numpy kernels (SHARDSTREAM_NATIVE=0)"
    version = subprocess.run(
        [sys.executable, "-m", "shardstream", "--version"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "numpy kernels" in version.stdout
