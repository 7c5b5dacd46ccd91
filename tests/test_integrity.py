"""Integrity at every size (DESIGN §3), through real servers and Loaders: single-byte flips in a
large shard (local and S3, with and without the disk tier) and in disk-cache files are either
harmless or DATA_LOSS naming version, shard and row group — never silently served — and manifests
written before row-group checksums still read and verify.

CI flips a shard of a few tens of MiB a few dozen times; `make soak` (`-m slow`) runs the issue's
full size: 100 flips in a default-size (256 MiB) shard, and 100 in disk-cache files.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from shardstream.manifest import Manifest
from shardstream.registry import Registry
from shardstream.server.backends.roots import open_registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.read.checksums import chunk_spans
from shardstream.server.writing.ingest import DEFAULT_SHARD_BYTES, IngestOptions, ingest
from shardstream.server.writing.shard_writer import describe_shard

from .support.flips import FlipTally, flip_byte, random_table, read_dataset
from .support.servers import Servers, scrape

Factory = Callable[..., LocalServer]
PAYLOAD_BYTES = 1000


@dataclasses.dataclass
class Big:
    root: Path
    manifest: Manifest
    source: object  # pa.Table

    @property
    def shard(self) -> Path:
        return self.root / self.manifest.name / self.manifest.shards[0].uri


def make_big(base: Path, shard_bytes: int) -> Big:
    """One dataset of about `shard_bytes` of incompressible rows, ingested with the default shard and
    row-group sizes (beyond 256 MiB: a full-size first shard and a small second one)."""
    n = shard_bytes // (PAYLOAD_BYTES + 16)
    table = random_table(n, PAYLOAD_BYTES, seed=1)
    src = base / "src.parquet"
    pq.write_table(table, src, row_group_size=16384)
    m = ingest(src, "big", base / "root", IngestOptions(progress=False))  # default row groups and shards
    return Big(base / "root", m, table)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Big:
    return make_big(tmp_path_factory.mktemp("big"), 24 << 20)


@pytest.fixture
def servers(big: Big) -> Iterator[Servers]:
    with Servers(big.root) as s:
        yield s


def flips(size: int, count: int, seed: int) -> list[tuple[int, int]]:
    """`count` (position, bit mask) pairs over a file of `size` bytes, seeded."""
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(size)), 1 << int(rng.integers(8))) for _ in range(count)]


def flip_shard(
    big: Big, servers: Servers, count: int, seed: int, *, cache_dir: Path | None = None
) -> FlipTally:
    """Flip one byte at a time in the shard; a fresh server (nothing cached: with `cache_dir`, a disk
    tier of its own under it) reads the whole dataset."""
    shard = big.manifest.shards[0]
    tally = FlipTally(big.source, big.manifest.ref, shard.uri)  # type: ignore[arg-type]
    size = big.shard.stat().st_size
    # Uniform positions, plus the footer and the first byte of a row group (a page header).
    chosen = flips(size, count, seed)
    chosen[:2] = [
        (size - 20, 0x10),
        (pq.read_metadata(big.shard).row_group(1).column(2).data_page_offset, 0x01),
    ]
    for i, (pos, mask) in enumerate(chosen):
        extra = ("--cache-dir", str(cache_dir / f"flip-{i}")) if cache_dir else ()
        flip_byte(big.shard, pos, mask)
        try:
            server = servers.start(extra_args=extra)
            tally.add(pos, read_dataset(server.target, big.manifest.ref))
            server.stop()
        finally:
            flip_byte(big.shard, pos, mask)
    print(tally.summary())
    return tally


def test_the_large_shard_is_one_shard_with_checksums(big: Big) -> None:
    (shard,) = big.manifest.shards
    assert shard.bytes > 20 << 20 and len(shard.row_groups) > 3 and shard.checksums is not None
    assert shard.checksums.columns == 3


@pytest.mark.parametrize("cache_dir", [False, True])
def test_byte_flips_in_a_large_shard_are_never_served(
    big: Big, servers: Servers, tmp_path: Path, cache_dir: bool
) -> None:
    tally = flip_shard(
        big,
        servers,
        24 if not cache_dir else 8,
        seed=12 + cache_dir,
        cache_dir=tmp_path if cache_dir else None,
    )
    assert not tally.silent and not tally.unnamed, tally.summary()
    assert tally.counts["data_loss"] >= 2, tally.summary()  # at least the footer and the page header


def test_only_the_columns_read_are_checked_and_a_flip_elsewhere_is_harmless(
    big: Big, servers: Servers
) -> None:
    payload = chunk_spans(pq.read_metadata(big.shard), 2, big.shard.stat().st_size)[2]
    assert payload.column == "payload"
    pos = payload.start + payload.length // 2
    flip_byte(big.shard, pos, 0x40)
    try:
        server = servers.start()
        ids = read_dataset(server.target, "big@1", columns=["id", "value"])
        assert not isinstance(ids, Exception)
        assert ids.select(["id", "value"]).equals(big.source.select(["id", "value"]))  # type: ignore[attr-defined]
        loss = read_dataset(server.target, "big@1")
        assert isinstance(loss, Exception)
        assert f"big@1: shard {big.manifest.shards[0].uri}: row group 2: column chunk 'payload'" in str(loss)
        assert "crc32" in str(loss) and str(big.root) not in str(loss)  # the check, never a server path
    finally:
        flip_byte(big.shard, pos, 0x40)


def flip_cache_files(big: Big, servers: Servers, tmp_path: Path, count: int, seed: int) -> None:
    """Fill a disk cache, then flip one byte of one of its files at a time: a fresh server re-reads
    that row group from storage, counts the file as corrupt and serves the source's bytes."""
    cache_dir = tmp_path / "spill"
    extra = ("--cache-dir", str(cache_dir))
    first = servers.start(extra_args=extra)
    assert read_dataset(first.target, "big@1").equals(big.source)  # type: ignore[union-attr]
    first.stop()
    files = sorted(cache_dir.glob("*.arrowc"))
    assert len(files) == sum(len(s.row_groups) for s in big.manifest.shards)
    rng = np.random.default_rng(seed)
    for _ in range(count):
        victim = files[int(rng.integers(len(files)))]
        original = victim.read_bytes()
        pos, mask = int(rng.integers(len(original))), 1 << int(rng.integers(8))
        flip_byte(victim, pos, mask)
        server = servers.start(metrics=True, extra_args=extra)
        got = read_dataset(server.target, "big@1")
        m = scrape(server)
        server.stop()
        assert not isinstance(got, Exception) and got.equals(big.source), (victim.name, pos)
        assert m["shardstream_disk_cache_corrupt_total"] == 1, (victim.name, pos)
        assert m["shardstream_storage_reads_total"] == 1  # that row group alone, from storage
        assert victim.read_bytes() == original  # read again, checked, and written back whole


def test_byte_flips_in_disk_cache_files_are_read_again_from_storage(
    big: Big, servers: Servers, tmp_path: Path
) -> None:
    flip_cache_files(big, servers, tmp_path, count=8, seed=5)


def test_swapped_disk_cache_files_are_corrupt_and_read_again_from_storage(
    big: Big, servers: Servers, tmp_path: Path
) -> None:
    """Two sound files of one shard's row groups swapped (each renamed to the other's key): both are
    corrupt — deleted, counted, read again from storage and written back whole — never served as each
    other; and the tier's byte gauge is the bytes on disk after those rewrites, not more."""
    shard = big.manifest.shards[0]
    assert len(shard.row_groups) >= 2 and shard.row_groups[0] == shard.row_groups[1]  # same rows: a swap
    cache_dir = tmp_path / "spill"
    extra = ("--cache-dir", str(cache_dir))
    first = servers.start(extra_args=extra)
    assert read_dataset(first.target, "big@1").equals(big.source)  # type: ignore[union-attr]
    first.stop()
    (a,) = cache_dir.glob(f"{shard.sha256}-0-*.arrowc")
    (b,) = cache_dir.glob(f"{shard.sha256}-1-*.arrowc")
    originals = {a: a.read_bytes(), b: b.read_bytes()}
    assert originals[a] != originals[b]
    a.write_bytes(originals[b])
    b.write_bytes(originals[a])

    server = servers.start(metrics=True, extra_args=extra)
    got = read_dataset(server.target, "big@1")
    m = scrape(server)
    server.stop()
    assert not isinstance(got, Exception) and got.equals(big.source)
    assert m["shardstream_disk_cache_corrupt_total"] == 2
    assert m["shardstream_storage_reads_total"] == 2  # those two row groups alone, from storage
    assert {a: a.read_bytes(), b: b.read_bytes()} == originals
    on_disk = sum(f.stat().st_size for f in cache_dir.glob("*.arrowc"))
    assert m["shardstream_disk_cache_bytes"] == on_disk


@pytest.mark.parametrize("cache_dir", [False, True])
def test_byte_flips_in_a_shard_on_s3_are_never_served(
    s3_root: str, tmp_path: Path, server_factory: Factory, cache_dir: bool
) -> None:
    table = random_table(6000, 200, seed=3)
    src = tmp_path / "src.parquet"
    pq.write_table(table, src)
    opts = IngestOptions(row_group_rows=1000, progress=False)
    with open_registry(s3_root) as reg:
        m = ingest(src, "remote", reg, opts)
        key = reg.shard_key(m, m.shards[0].uri)
        pristine = reg.storage.get(key)
        tally = FlipTally(table, m.ref, m.shards[0].uri)
        for i, (pos, mask) in enumerate(flips(len(pristine), 4, seed=7 + cache_dir)):
            extra = ("--cache-dir", str(tmp_path / f"spill-{i}")) if cache_dir else ()
            data = bytearray(pristine)
            data[pos] ^= mask
            reg.storage.put(key, bytes(data))
            server = server_factory(s3_root, extra_args=extra)
            tally.add(pos, read_dataset(server.target, m.ref))
            server.stop()
        reg.storage.put(key, pristine)
    print(tally.summary())
    assert not tally.silent and not tally.unnamed and tally.counts["data_loss"] >= 3, tally.summary()


def verify_cli(root: Path, dataset: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardstream", "datasets", "verify", dataset, "--root", str(root), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_manifest_without_row_group_checksums_still_reads_and_verifies(
    tmp_path: Path, server_factory: Factory
) -> None:
    """Written as before checksums existed: no page checksums, no `checksums` in the manifest."""
    root = tmp_path / "root"
    table = random_table(3000, 100, seed=4)
    files = []
    for i in range(2):
        path = root / "old" / "data" / "x" / f"part-{i}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.slice(i * 1500, 1500), path, row_group_size=500)
        files.append(dataclasses.replace(describe_shard(path, f"data/x/part-{i}.parquet"), checksums=None))
    with Registry(root) as reg:
        m = reg.create_version(
            "old", lambda v, p: Manifest(name="old", version=v, schema=table.schema, shards=tuple(files))
        )
        manifest_file = root / "old" / "manifests" / "1.json"
        text = manifest_file.read_text()
        assert '"checksums"' not in text and reg.resolve("old@1").fingerprint == m.fingerprint

    server = server_factory(root)
    got = read_dataset(server.target, "old@1")
    assert not isinstance(got, Exception) and got.equals(table)
    r = verify_cli(root, "old")
    assert r.returncode == 0, r.stderr
    assert "no row-group checksums" in r.stdout + r.stderr
    assert manifest_file.read_text() == text  # verify upgrades nothing

    # Shards of such a manifest up to the whole-file hash limit are checked by their sha256.
    shard = root / "old" / files[1].uri
    flip_byte(shard, shard.stat().st_size // 2, 0x08)
    server.stop()
    fresh = server_factory(root)
    loss = read_dataset(fresh.target, "old@1")
    assert isinstance(loss, Exception) and f"old@1: shard {files[1].uri}: sha256" in str(loss)
    r = verify_cli(root, "old")
    assert r.returncode == 1 and f"{files[1].uri}: sha256" in r.stdout, r.stdout
    assert manifest_file.read_text() == text


def test_verify_names_the_row_group_and_column_of_a_flip(big: Big) -> None:
    chunk = chunk_spans(pq.read_metadata(big.shard), 3, big.shard.stat().st_size)[0]
    pos = chunk.end - 1  # its last byte
    flip_byte(big.shard, pos, 0x02)
    try:
        r = verify_cli(big.root, "big@1")
    finally:
        flip_byte(big.shard, pos, 0x02)
    assert r.returncode == 1
    assert f"BAD  {big.manifest.shards[0].uri}: sha256" in r.stdout
    assert "row group 3: column chunk 'id' crc32" in r.stdout, r.stdout
    assert verify_cli(big.root, "big@1").returncode == 0


# --- the full size: `make soak` ------------------------------------------------------------
@pytest.fixture(scope="module")
def default_size(tmp_path_factory: pytest.TempPathFactory) -> Big:
    return make_big(tmp_path_factory.mktemp("default-size"), DEFAULT_SHARD_BYTES + (8 << 20))


@pytest.mark.slow
def test_100_byte_flips_in_a_default_size_shard_are_never_served(default_size: Big) -> None:
    assert default_size.manifest.shards[0].bytes >= DEFAULT_SHARD_BYTES  # the first shard: full size
    with Servers(default_size.root) as servers:
        tally = flip_shard(default_size, servers, 100, seed=100)
    assert not tally.silent and not tally.unnamed, tally.summary()


@pytest.mark.slow
def test_100_byte_flips_in_disk_cache_files_are_never_served(default_size: Big, tmp_path: Path) -> None:
    with Servers(default_size.root) as servers:
        flip_cache_files(default_size, servers, tmp_path, count=100, seed=101)
