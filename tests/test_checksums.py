"""Row-group checksums in process: the manifest model and its old form, computing them (ingest,
register, in any block size), checking them on the read path and in the disk tier, and Parquet page
checksums in the shards shardstream writes. The same through real servers: test_integrity.py."""

from __future__ import annotations

import dataclasses
import gc
import json
import struct
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.manifest import Manifest, Shard, ShardChecksums
from shardstream.registry import Registry
from shardstream.server.read import shards
from shardstream.server.read.checksums import chunk_spans, footer_bytes_of, scan_shard
from shardstream.server.read.reader import DatasetReader, new_row_group_cache
from shardstream.server.read.shards import read_footer
from shardstream.server.read.spill import LEGACY_SUFFIX, SPILL_CORRUPT, SUFFIX, SpillTier
from shardstream.server.writing.ingest import IngestOptions, ingest
from shardstream.server.writing.registry_ops import register

from .support.data import make_table
from .support.flips import flip_byte

# A manifest as written before row-group checksums existed (by that code, fingerprint and all).
OLD_MANIFEST = {
    "arrow_schema": "/////6gAAAAQAAAAAAAKAAwABgAFAAgACgAAAAABBAAMAAAACAAIAAAABAAIAAAABAAAAAIAAABEAAAABAAAANT///8AAAEF"
    "EAAAABwAAAAEAAAAAAAAAAQAAAB0ZXh0AAAAAAQABAAEAAAAEAAUAAgABgAHAAwAAAAQABAAAAAAAAECEAAAABwAAAAEAAAAAAAAAAIAAABp"
    "ZAAACAAMAAgABwAIAAAAAAAAAUAAAAA=",
    "change": "create",
    "created_at": "2026-01-01T00:00:00+00:00",
    "fields": [{"name": "id", "type": "int64"}, {"name": "text", "type": "string"}],
    "fingerprint": "403b5730912229e5b05350d814f7d9296bb431d58f3890743bff96dd27b4ac27",
    "format": 1,
    "metadata": {"modality": "table"},
    "name": "legacy",
    "num_bytes": 1234,
    "num_rows": 10,
    "parent": None,
    "shards": [
        {
            "bytes": 1234,
            "row_groups": [6, 4],
            "rows": 10,
            "sha256": "ab" * 32,
            "uri": "data/a/part-00000.parquet",
        }
    ],
    "version": 1,
}


def toy(tmp_path: Path, n: int = 1009, **opts: int) -> tuple[Path, Manifest]:
    src = tmp_path / "src.parquet"
    pq.write_table(make_table(n), src)
    root = tmp_path / "root"
    options = IngestOptions(
        row_group_rows=opts.get("rg", 100), shard_rows=opts.get("shard", 400), progress=False
    )
    return root, ingest(src, "toy", root, options)


def stripped(m: Manifest) -> Manifest:
    """`m` as a manifest written before row-group checksums."""
    return dataclasses.replace(m, shards=tuple(dataclasses.replace(s, checksums=None) for s in m.shards))


# --- the manifest ----------------------------------------------------------------------------------
def test_an_old_manifest_loads_keeps_its_fingerprint_and_its_json() -> None:
    m = Manifest.from_json(OLD_MANIFEST)  # the stored fingerprint is checked on load
    assert m.fingerprint == OLD_MANIFEST["fingerprint"]
    assert m.shards[0].checksums is None
    assert json.loads(m.dumps()) == OLD_MANIFEST  # written back exactly as it was


def test_checksums_round_trip_and_stay_out_of_the_fingerprint(tmp_path: Path) -> None:
    _, m = toy(tmp_path)
    assert all(s.checksums is not None and s.checksums.columns == 4 for s in m.shards)
    again = Manifest.loads(m.dumps())
    assert again == m and again.shards[0].checksums == m.shards[0].checksums
    old = stripped(m)
    assert old.fingerprint == m.fingerprint  # same content, same identity
    assert '"checksums"' not in old.dumps()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda c: {**c, "algorithm": "md5"}, "unsupported algorithm"),
        (lambda c: {**c, "row_groups": ["12345"] + c["row_groups"][1:]}, "8-hex-digit"),
        (lambda c: {**c, "row_groups": ["ABCDEF01" * 4] + c["row_groups"][1:]}, "8-hex-digit"),
        (lambda c: {**c, "row_groups": c["row_groups"][:-1]}, "checksums for"),
        (lambda c: {**c, "footer": "zz"}, "malformed"),
    ],
)
def test_malformed_checksums_are_refused(tmp_path: Path, change, match: str) -> None:  # type: ignore[no-untyped-def]
    _, m = toy(tmp_path)
    d = m.to_json()
    d["shards"][0]["checksums"] = change(d["shards"][0]["checksums"])
    with pytest.raises(InvalidArgumentError, match=match):
        Manifest.from_json(d)


# --- computing them --------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [1, 7, 4096, 1 << 20])
def test_a_scan_in_any_block_size_gives_each_chunk_its_crc32(tmp_path: Path, block: int) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(make_table(600 if block > 1 else 60), path, row_group_size=25)
    data = path.read_bytes()
    (_, tail), md = read_footer(lambda s, n: data[s : s + n], len(data))
    fb = footer_bytes_of(tail)
    size, sha, sums = scan_shard((data[i : i + block] for i in range(0, len(data), block)), md, len(data), fb)
    assert size == len(data) and sums.footer == zlib.crc32(data[-fb:]) and sums.footer_bytes == fb
    for g in range(md.num_row_groups):
        want = tuple(zlib.crc32(data[s.start : s.end]) for s in chunk_spans(md, g, len(data)))
        assert sums.chunks(g) == want


def test_register_records_the_checksums_ingest_did(tmp_path: Path) -> None:
    root, m = toy(tmp_path)
    with Registry(root) as reg:
        again = register(reg, "toy", [m.shards[0].uri.rsplit("/", 1)[0]], progress=False)
    assert again.fingerprint == m.fingerprint
    assert [s.checksums for s in again.shards] == [s.checksums for s in m.shards]


def test_shards_shardstream_writes_carry_parquet_page_checksums(tmp_path: Path) -> None:
    root, m = toy(tmp_path)
    path = root / "toy" / m.shards[0].uri
    span = chunk_spans(pq.read_metadata(path), 0, path.stat().st_size)[3]  # text: a page's values
    flip_byte(path, span.end - 3, 0x01)
    with pytest.raises(OSError, match="(?i)crc|checksum"):
        pq.ParquetFile(path, page_checksum_verification=True).read_row_group(0, columns=["text"])


# --- checking them ---------------------------------------------------------------------------------
def test_a_read_checks_only_the_chunks_it_decodes(tmp_path: Path) -> None:
    root, m = toy(tmp_path)
    paths = [root / "toy" / s.uri for s in m.shards]
    span = chunk_spans(pq.read_metadata(paths[1]), 2, paths[1].stat().st_size)[3]
    flip_byte(paths[1], span.start + span.length // 2, 0x20)
    reader = DatasetReader(m, paths, new_row_group_cache(1 << 30))
    rows = np.arange(m.num_rows)
    assert reader.take(rows, ["id", "label"]).column("id").to_pylist() == list(range(m.num_rows))
    with pytest.raises(
        DataLossError, match=rf"toy@1: shard {m.shards[1].uri}: row group 2: column chunk 'text'"
    ):
        reader.take(rows, ["text"])


@pytest.mark.parametrize("checked", [True, False])
def test_arrow_reads_a_shard_only_in_the_thread_that_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checked: bool
) -> None:
    """A row group read through a Python file is decoded in the caller's thread, not in Arrow's pools:
    a pool thread still holding the Python objects it read when the process exits aborts it
    (shards.PYTHON_FILE_THREADS). Checked (manifest checksums) and unchecked (a remote shard of an
    older manifest, read by ranges as they come)."""
    root, m = toy(tmp_path)
    handed: list[int] = []  # the thread of each read
    released: list[int] = []  # the thread that let go of each read's bytes

    class Held(bytearray):  # what Arrow holds of a read (as a PyBuffer), and where it lets go
        def __del__(self) -> None:
            released.append(threading.get_ident())

    for cls in (shards._CheckedFile, shards._SparseFile):
        read = cls.read

        def spied(self: object, n: int = -1, read: Callable[..., bytes] = read) -> Held:
            handed.append(threading.get_ident())
            return Held(read(self, n))

        monkeypatch.setattr(cls, "read", spied)
    for shard in m.shards:
        path = root / "toy" / shard.uri
        if checked:
            f = shards.open_shard(path, shard, hash_check_max_bytes=0)
        else:
            data = path.read_bytes()

            def fetch(start: int, n: int, data: bytes = data) -> bytes:
                return data[start : start + n]

            f = shards._RangedShard(fetch, len(data), *shards.read_footer(fetch, len(data)), None)
        for g, rows in enumerate(shard.row_groups):
            assert f.read_row_group(g, ["id", "label", "text"]).num_rows == rows
        del f
    gc.collect()  # (a reference cycle would keep some alive: collected here, in this thread)
    me = threading.get_ident()
    assert handed and set(handed) == {me}
    # every read's bytes let go (the tables were dropped), and all of them in this thread
    assert len(released) == len(handed) and set(released) == {me}


def test_rows_read_unchecked_are_never_served_as_checked(tmp_path: Path) -> None:
    """Two versions of one content, one without checksums, share the server's cache: a row group the
    older one read unchecked (a shard over the whole-file hash limit) is not what the newer one gets."""
    root, m = toy(tmp_path)
    paths = [root / "toy" / s.uri for s in m.shards]
    span = chunk_spans(pq.read_metadata(paths[0]), 1, paths[0].stat().st_size)[0]
    flip_byte(paths[0], span.end - 2, 0x01)
    cache = new_row_group_cache(1 << 30)
    rows = np.arange(100, 200)  # shard 0, row group 1
    try:
        DatasetReader(stripped(m), paths, cache, hash_check_max_bytes=0).take(rows, ["id"])
    except (DataLossError, OSError, pa.ArrowException):
        pass  # whatever an unchecked read of a bad chunk gives, it is not the question here
    with pytest.raises(DataLossError, match="row group 1: column chunk 'id'"):
        DatasetReader(m, paths, cache).take(rows, ["id"])


def test_a_footer_that_differs_is_data_loss_before_it_is_parsed(tmp_path: Path) -> None:
    root, m = toy(tmp_path)
    paths = [root / "toy" / s.uri for s in m.shards]
    flip_byte(paths[2], paths[2].stat().st_size - 9, 0x01)  # the footer's length field
    reader = DatasetReader(m, paths, new_row_group_cache(1 << 30))
    with pytest.raises(DataLossError, match=rf"toy@1: shard {m.shards[2].uri}: footer .* crc32"):
        reader.take(np.array([900]), ["id"])


# --- the disk tier ---------------------------------------------------------------------------------
def test_a_disk_cache_file_failing_its_checksum_is_dropped_never_served(tmp_path: Path) -> None:
    table = pa.table({"x": np.arange(1000, dtype=np.int64)})
    tier = SpillTier(tmp_path / "d")
    tier.store("ab" * 32, 0, ["x"], table)
    path = tier._path("ab" * 32, 0, ["x"])
    assert tier.load("ab" * 32, 0, ["x"], 1000).equals(table)
    size = path.stat().st_size
    for pos in (100, size - 32, size - 28, size - 24, size - 1):  # data; trailer: magic, crc, length, key
        original = path.read_bytes()
        flip_byte(path, pos, 0x04)
        before = SPILL_CORRUPT._value.get()
        assert tier.load("ab" * 32, 0, ["x"], 1000) is None and not path.exists()
        assert SPILL_CORRUPT._value.get() == before + 1
        path.write_bytes(original)
    # checked and unchecked reads of one row group are separate files
    tier.store("ab" * 32, 1, ["x"], table, checked=False)
    assert tier.load("ab" * 32, 1, ["x"], 1000) is None
    assert tier.load("ab" * 32, 1, ["x"], 1000, checked=False).equals(table)


def test_a_disk_cache_file_under_another_key_is_corrupt_and_the_byte_count_follows_the_disk(
    tmp_path: Path,
) -> None:
    """Sound files swapped, or one renamed to another key, are never served as that key; the tier's
    byte count takes a deleted file off and does not grow when corrupt files are written again."""
    tier = SpillTier(tmp_path / "d")
    t0, t1 = (pa.table({"x": np.arange(1000, dtype=np.int64) + k}) for k in (0, 1000))
    tier.store("ab" * 32, 0, ["x"], t0)
    tier.store("ab" * 32, 1, ["x"], t1)
    p0, p1 = tier._path("ab" * 32, 0, ["x"]), tier._path("ab" * 32, 1, ["x"])

    def on_disk() -> int:
        return sum(p.stat().st_size for p in tier.dir.glob(f"*{SUFFIX}"))

    assert tier._bytes == on_disk()
    b0, b1 = p0.read_bytes(), p1.read_bytes()
    p0.write_bytes(b1)
    p1.write_bytes(b0)
    before = SPILL_CORRUPT._value.get()
    for group, table in ((0, t0), (1, t1)):
        got = tier.get_or_read("ab" * 32, group, ["x"], 1000, lambda table=table: table)
        assert got.equals(table)
        assert tier._bytes == on_disk() == len(b0) + len(b1)
    assert SPILL_CORRUPT._value.get() == before + 2
    assert (p0.read_bytes(), p1.read_bytes()) == (b0, b1)
    p1.rename(tier._path("ab" * 32, 2, ["x"]))  # renamed: group 1's bytes under group 2's name
    assert tier.load("ab" * 32, 2, ["x"], 1000) is None
    assert SPILL_CORRUPT._value.get() == before + 3 and tier._bytes == on_disk() == len(b0)
    assert tier.get_or_make("feat-a", lambda: t0, lambda t: True).equals(t0)
    tier._named("feat-a").rename(tier._named("feat-b"))  # other kinds of file are bound to their name too
    assert tier.load_file("feat-b", lambda t: True) is None
    assert SPILL_CORRUPT._value.get() == before + 4


def test_disk_cache_files_of_the_trailer_without_a_key_are_deleted_not_corrupt(tmp_path: Path) -> None:
    tier = SpillTier(tmp_path / "d")
    table = pa.table({"x": [1, 2, 3]})
    path = tier._path("cd" * 32, 0, ["x"])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    body = path.read_bytes()
    path.write_bytes(body + struct.pack("<4sIQ", b"SSCK", zlib.crc32(body), len(body)))
    before = SPILL_CORRUPT._value.get()
    assert tier.load("cd" * 32, 0, ["x"], 3) is None and not path.exists()
    assert SPILL_CORRUPT._value.get() == before


def test_disk_cache_files_from_before_checksums_are_deleted_at_start(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    old = d / f"{'ab' * 32}-0-0123456789abcdef{LEGACY_SUFFIX}"
    with pa.OSFile(str(old), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("x", pa.int64())])) as w:
        w.write_table(pa.table({"x": [1]}))
    SpillTier(d)
    assert not old.exists()


def test_shard_checksums_of_builds_the_hex_form() -> None:
    sums = ShardChecksums.of(100, 0xDEADBEEF, [[1, 0xFFFFFFFF], [2, 3]])
    assert sums.row_groups == ("00000001ffffffff", "0000000200000003") and sums.chunks(0) == (1, 0xFFFFFFFF)
    assert Shard("a.parquet", 3, 10, (1, 2), "0" * 64, sums).to_json()["checksums"]["footer"] == "deadbeef"
