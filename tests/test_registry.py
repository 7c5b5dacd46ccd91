from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from shardstream.errors import InvalidArgumentError, NotFoundError
from shardstream.manifest import DatasetRef, Manifest, Shard
from shardstream.registry import Registry


def manifest(name: str = "ds", version: int = 1, rows: int = 10, sha: str = "ab" * 32) -> Manifest:
    return Manifest(
        name=name,
        version=version,
        schema=pa.schema([("id", pa.int64()), ("t", pa.string())]),
        shards=(Shard("data/x/part-0.parquet", rows, 123, (rows - 3, 3), sha),),
    )


def test_manifest_json_round_trip_and_fingerprint() -> None:
    m = manifest()
    again = Manifest.loads(m.dumps())
    assert again == m and again.fingerprint == m.fingerprint
    assert manifest(version=2).fingerprint == m.fingerprint  # same content, same order
    assert manifest(sha="cd" * 32).fingerprint != m.fingerprint
    assert manifest(rows=11).fingerprint != m.fingerprint


def test_tampered_manifest_is_refused() -> None:
    d = manifest().to_json()
    d["shards"][0]["rows"] = 11
    d["shards"][0]["row_groups"] = [8, 3]
    with pytest.raises(InvalidArgumentError, match="fingerprint"):
        Manifest.from_json(d)
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        Manifest.loads("{nope")
    with pytest.raises(InvalidArgumentError, match="malformed"):
        Manifest.from_json({"format": 1, "name": "x"})


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("web", DatasetRef("web")),
        ("web@3", DatasetRef("web", 3)),
        ("web@prod", DatasetRef("web", tag="prod")),
    ],
)
def test_dataset_ref_parse(text: str, ref: DatasetRef) -> None:
    assert DatasetRef.parse(text) == ref and str(ref) == text


@pytest.mark.parametrize("bad", ["", "@3", "web@0", "we b", "web@", "-x", "a/b"])
def test_dataset_ref_rejects(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        DatasetRef.parse(bad)


def test_versions_and_not_found(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    with pytest.raises(NotFoundError, match="no dataset named 'ds'"):
        reg.resolve("ds")
    for _ in range(2):
        reg.create_version("ds", lambda v, p: manifest(version=v))
    assert reg.versions("ds") == [1, 2]
    assert reg.resolve("ds").version == 2
    assert reg.resolve("ds@1").version == 1
    with pytest.raises(NotFoundError, match="has no version 7 \\(versions: 1, 2\\)"):
        reg.resolve("ds@7")
    with pytest.raises(NotFoundError, match="no tag 'prod'"):
        reg.resolve("ds@prod")
    (tmp_path / "ds" / "tags").mkdir()
    (tmp_path / "ds" / "tags" / "prod").write_text("1\n")
    assert reg.resolve("ds@prod").version == 1
    assert reg.names() == ["ds"]


def test_concurrent_writers_get_distinct_versions(tmp_path: Path) -> None:
    made: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        barrier.wait()
        m = Registry(tmp_path).create_version("ds", lambda v, p: manifest(version=v, sha=f"{i:064x}"))
        with lock:
            made.append(m.version)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(made) == list(range(1, 9))
    shas = {
        json.loads((tmp_path / "ds" / "manifests" / f"{v}.json").read_text())["shards"][0]["sha256"]
        for v in made
    }
    assert len(shas) == 8  # nobody's manifest was overwritten
    assert not list((tmp_path / "ds" / "manifests").glob(".*tmp"))


def test_a_servers_planner_reads_a_versions_manifest_once_and_sees_a_new_latest_at_once(tmp_path: Path) -> None:
    """A resumed job's GetDataset of `name` (the latest) or of a tag costs the version's lookup, not
    its manifest's parse and fingerprint each time; a version registered since is the latest at once."""
    from shardstream.server.backends.roots import open_registry
    from shardstream.server.read.plan import ReadPlanner
    from shardstream.server.read.reader import new_row_group_cache

    from .support.data import write_dataset

    root = tmp_path / "root"
    first = write_dataset(root, "toy", 60, row_group_rows=20, shard_rows=40)
    Registry(root).set_tag("toy@1", "prod")
    with open_registry(str(root)) as registry:
        planner = ReadPlanner(registry, new_row_group_cache(1 << 20))
        loads: list[int] = []
        load = registry.load
        registry.load = lambda name, version: loads.append(version) or load(name, version)  # type: ignore[method-assign]
        planner.reader(planner.resolve("toy"))  # a stream of it: its reader kept
        for ref in ("toy", "toy@prod", "toy@1", "toy"):
            assert planner.resolve(ref).fingerprint == first.fingerprint
        assert loads == [1]
        second = write_dataset(root, "toy", 70, row_group_rows=20, shard_rows=40)
        assert planner.resolve("toy").version == second.version == 2  # the new latest, read
        assert planner.resolve("toy@prod").version == 1
        with pytest.raises(NotFoundError, match="no tag"):
            planner.resolve("toy@nope")
        with pytest.raises(NotFoundError, match="no dataset"):
            planner.resolve("nothing")
