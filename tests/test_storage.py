"""Storage keys, path traversal, and the local backend."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shardstream.cli import main
from shardstream.errors import InvalidArgumentError
from shardstream.manifest import Manifest
from shardstream.registry import Registry
from shardstream.server.backends.roots import open_storage
from shardstream.storage import LocalStorage, check_key

from .support.data import make_table, write_dataset

TRAVERSALS = [
    "..",
    "../outside.parquet",
    "data/../../outside.parquet",
    "/etc/passwd",
    "%2e%2e/outside.parquet",
    "%2E%2E%2Foutside.parquet",
    "%252e%252e/outside.parquet",
    "file:///etc/passwd",
    "s3://other-bucket/x",
    "data\\..\\x",
    "~/x",
    "a//b",
    "./x",
]


@pytest.mark.parametrize("key", TRAVERSALS)
def test_unsafe_keys_are_rejected(key: str) -> None:
    with pytest.raises(InvalidArgumentError, match="only relative paths under the root"):
        check_key(key)


@pytest.mark.parametrize(
    "key", ["data/x/part-00000.parquet", "date=2024-01-01/part-0.snappy.parquet", "a%20b"]
)
def test_ordinary_keys_pass(key: str) -> None:
    assert check_key(key) == key


def test_manifest_with_traversing_shard_uri_is_refused(data_root: Path) -> None:
    d = Registry(data_root).resolve("toy@1").to_json()
    d["shards"][0]["uri"] = "../../../etc/passwd"
    d.pop("fingerprint")
    with pytest.raises(InvalidArgumentError, match="shard uri"):
        Manifest.from_json(d)


def test_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("secret")
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(tmp_path / "outside.txt", root / "link")
    with pytest.raises(InvalidArgumentError, match="outside the root"):
        LocalStorage(root).get("link")


@pytest.mark.parametrize("where", ["ftp://host/x", "file:///tmp/x", "gs://bucket/x"])
def test_unsupported_roots_are_one_clear_error(where: str) -> None:
    with pytest.raises(InvalidArgumentError, match="unsupported location"):
        open_storage(where)


def test_local_storage_basics(tmp_path: Path) -> None:
    st = LocalStorage(tmp_path)
    assert st.put_if_absent("a/b", b"one") and not st.put_if_absent("a/b", b"two")
    assert st.get("a/b") == b"one"
    info = st.head("a/b")
    assert st.get_range("a/b", 1, 2, etag=info.etag) == b"ne"
    st.put("a/b", b"three")
    assert st.get("a/b") == b"three" and st.list("a") == ["a/b"] and st.children("") == ["a"]
    assert not [p for p in tmp_path.rglob("*tmp")]


@pytest.mark.parametrize(
    "source",
    [
        "../outside",
        "../outside/x.parquet",
        "%2e%2e/outside/x.parquet",
        "file://{base}/outside/x.parquet",
        "{base}/outside/x.parquet",
        "{base}/root/ds/../../outside/x.parquet",
        "/etc",
    ],
)
def test_register_refuses_sources_outside_the_dataset(
    tmp_path: Path, source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    pq.write_table(make_table(10), outside / "x.parquet")
    before = os.stat(outside / "x.parquet").st_atime_ns
    root = tmp_path / "root"
    (root / "ds").mkdir(parents=True)
    code = main(["register", "ds", "--from", source.format(base=tmp_path), "--root", str(root), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("shardstream: error:") and "Traceback" not in err
    assert os.stat(outside / "x.parquet").st_atime_ns == before
    assert Registry(root).versions("ds") == []


@pytest.mark.parametrize("ref", ["../toy", "toy/../../x", "%2e%2e", "/abs"])
def test_dataset_names_cannot_traverse(data_root: Path, ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["datasets", "show", ref, "--root", str(data_root)]) == 1
    assert "invalid dataset name" in capsys.readouterr().err


def test_ingest_to_a_local_root_still_writes_in_place(tmp_path: Path) -> None:
    m = write_dataset(tmp_path / "root", "w", 100, shard_rows=40)
    assert all((tmp_path / "root" / "w" / s.uri).is_file() for s in m.shards)
