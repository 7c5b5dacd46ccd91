"""Serving from a real S3 server (SeaweedFS): same rows as local, ranged reads, ETag pinning,
integrity on the read path, refused credentials."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from shardstream.client import Loader
from shardstream.errors import DataLossError, UnauthenticatedError
from shardstream.server.backends.roots import open_registry
from shardstream.server.read.reader import DatasetReader, new_row_group_cache
from shardstream.server.read.shards import STORAGE_FETCHED_BYTES
from shardstream.server.writing.ingest import IngestOptions, ingest
from shardstream.storage import ObjectRef

from .support.data import make_table
from .support.faults import CuttingProxy


def ingest_both(tmp_path: Path, s3_root: str, n: int = 1009, **opts: int) -> tuple[Path, str]:
    src = tmp_path / "src.parquet"
    pq.write_table(make_table(n), src)
    options = IngestOptions(
        row_group_rows=opts.get("rg", 50), shard_rows=opts.get("shard", 230), progress=False
    )
    local = tmp_path / "local"
    a = ingest(src, "toy", local, options)
    b = ingest(src, "toy", s3_root, options)
    assert a.fingerprint == b.fingerprint  # same content, same identity, same read order
    return local, s3_root


def test_loader_gets_the_same_rows_from_s3_as_from_local(
    tmp_path: Path, s3_root: str, server_factory
) -> None:  # type: ignore[no-untyped-def]
    local, remote = ingest_both(tmp_path, s3_root)
    got = {}
    for where, root in (("local", local), ("s3", remote)):
        server = server_factory(root)
        with Loader(
            [server.target], "toy@1", batch_size=32, seed=7, shuffle=True, provenance=True, timeout_s=30
        ) as ld:
            batches = list(ld)
        got[where] = {
            c: np.concatenate([b[c] for b in batches]) for c in ("id", "x", "label", "_shard", "_row")
        }
    for c in got["local"]:
        assert np.array_equal(got["local"][c], got["s3"][c]), c
    assert sorted(got["s3"]["id"].tolist()) == list(range(1009))


def test_remote_reads_fetch_the_footer_and_only_the_row_groups_needed(tmp_path: Path, s3_root: str) -> None:
    src = tmp_path / "src.parquet"
    pq.write_table(make_table(20_000), src)
    with open_registry(s3_root) as reg:
        m = ingest(src, "big", reg, IngestOptions(row_group_rows=1000, shard_rows=20_000, progress=False))
        shard = m.shards[0]
        ref = reg.shard_path(m, shard.uri)
        assert isinstance(ref, ObjectRef)
        # hash_check_max_bytes=0: skip the whole-shard hash to see the ranged reads alone
        reader = DatasetReader(m, [ref], new_row_group_cache(1 << 30), hash_check_max_bytes=0)
        before = STORAGE_FETCHED_BYTES._value.get()
        batch = reader.take(np.array([5, 15_500]), ["id"])
        fetched = STORAGE_FETCHED_BYTES._value.get() - before
    assert batch.column("id").to_pylist() == [5, 15_500]
    assert 0 < fetched < shard.bytes / 4, (fetched, shard.bytes)


def test_object_overwritten_mid_read_is_data_loss(tmp_path: Path, s3_root: str) -> None:
    src = tmp_path / "src.parquet"
    pq.write_table(make_table(400), src)
    with open_registry(s3_root) as reg:
        m = ingest(src, "ow", reg, IngestOptions(row_group_rows=100, shard_rows=400, progress=False))
        ref = reg.shard_path(m, m.shards[0].uri)
        assert isinstance(ref, ObjectRef)
        reader = DatasetReader(m, [ref], new_row_group_cache(1 << 30))
        assert reader.take(np.array([0]), ["id"]).column("id").to_pylist() == [0]  # opened, pinned
        other = tmp_path / "other.parquet"
        pq.write_table(make_table(400, start=1000), other, row_group_size=100)
        reg.storage.put_file(ref.key, other)  # overwritten while the reader is serving it
        with pytest.raises(DataLossError, match=f"{m.shards[0].uri}.*overwritten"):
            reader.take(np.array([350]), ["id"])


def test_corrupt_or_replaced_shard_on_s3_is_data_loss_naming_it(
    tmp_path: Path, s3_root: str, server_factory
) -> None:  # type: ignore[no-untyped-def]
    _, remote = ingest_both(tmp_path, s3_root, n=300, rg=50, shard=100)
    with open_registry(remote) as reg:
        m = reg.resolve("toy@1")
        key = reg.shard_key(m, m.shards[1].uri)
        data = bytearray(reg.storage.get(key))
        data[len(data) // 3] ^= 0x04  # same size, one bit off
        reg.storage.put(key, bytes(data))
    server = server_factory(remote)
    with Loader([server.target], "toy", batch_size=10, shuffle=False) as ld:
        with pytest.raises(DataLossError, match=rf"toy@1: shard {m.shards[1].uri}: row group \d+: column chunk .* crc32"):
            for _ in ld:
                pass
    r = subprocess.run(
        [sys.executable, "-m", "shardstream", "datasets", "verify", "toy", "--root", remote, "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and m.shards[1].uri in r.stdout and "Traceback" not in r.stderr


@pytest.mark.parametrize("command", [["datasets", "list"], ["serve", "--port", "0"]])
def test_wrong_credentials_are_one_clear_error_not_a_hang(
    s3_root: str, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "shardstream", *command, "--root", s3_root],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    assert "refused the credentials" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 or command[0] == "serve"
    assert time.monotonic() - t0 < 60


def test_wrong_credentials_in_process(s3_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    with open_registry(s3_root) as reg, pytest.raises(UnauthenticatedError, match="AWS_ACCESS_KEY_ID"):
        reg.names()


def test_a_body_cut_mid_read_is_resumed(s3_server, s3_root: str) -> None:  # type: ignore[no-untyped-def]
    from shardstream.server.backends.s3 import S3_RESUMES, S3Storage

    payload = np.random.default_rng(0).bytes(600_000)
    with S3Storage(s3_root) as direct:
        direct.put("blob", payload)
        etag = direct.head("blob").etag
    port = int(s3_server.endpoint.rsplit(":", 1)[1])
    with (
        CuttingProxy(port, cut_after_bytes=100_000, cuts=2) as proxy,
        S3Storage(s3_root, endpoint_url=proxy.endpoint) as st,
    ):
        before = S3_RESUMES._value.get()
        assert st.get_range("blob", 1000, 500_000, etag=etag) == payload[1000:501_000]
        assert proxy.cuts_done == 2 and S3_RESUMES._value.get() - before == 2
