"""`datasets gc`: the leftovers of a killed ingest go, nothing a manifest references does, nothing
young does (a running ingest), and a dataset whose references are unknown is left alone — on a local
root with a real `shardstream ingest` killed by SIGKILL, and on a real S3 server."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from shardstream.cli.datasets_gc import duration
from shardstream.client import Loader
from shardstream.manifest import Manifest
from shardstream.registry import Registry
from shardstream.server.backends.roots import open_registry, open_storage
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest
from shardstream.server.writing.orphan_files import remove_orphans

from .support.bad_registry import (
    age,
    big_source,
    break_manifest,
    kill_ingest_midway,
    link_dataset,
    several_datasets,
    tree,
)
from .support.data import make_table, put_parquet, write_dataset
from .support.processes import run_cli

HOUR_S = 3600


def referenced(root: Path) -> dict[str, tuple[int, int]]:
    """Every file some manifest references, with its size and mtime."""
    reg = Registry(root)
    files = tree(root)
    keys = {
        f"{m.name}/{s.uri}"
        for name in reg.names()
        for m in reg.manifests(name)
        if isinstance(m, Manifest)
        for s in m.shards
    }
    assert keys <= set(files)
    return {k: files[k] for k in keys}


def test_gc_removes_what_a_killed_ingest_left_and_nothing_referenced(tmp_path: Path) -> None:
    root = tmp_path / "root"
    several_datasets(root)
    orphan = kill_ingest_midway(root, "alpha", big_source(tmp_path / "big.parquet"))
    assert Registry(root).versions("alpha") == [1, 2]  # killed before its manifest
    left = sorted(p.name for p in orphan.iterdir())
    assert left and all(n.startswith("part-") for n in left), left
    orphan_bytes = sum(p.stat().st_size for p in orphan.iterdir())
    # A writer killed mid-write leaves its temp file; a new dataset's first ingest killed leaves a
    # directory with no manifest at all (made here as those writers leave them).
    temp = root / "alpha" / "manifests" / f".3.json.{uuid.uuid4().hex}.tmp"
    temp.write_text('{"format": 1, "na')
    fresh = root / "fresh" / "data" / uuid.uuid4().hex
    fresh.mkdir(parents=True)
    (fresh / "part-00000.parquet").write_bytes(b"PAR1 cut short")
    empty = root / "beta" / "data" / uuid.uuid4().hex
    empty.mkdir()
    foreign = root / "alpha" / "data" / "2024-06" / "part-0.parquet"  # waiting for `register`
    put_parquet(str(root), "alpha/data/2024-06/part-0.parquet", make_table(10), tmp_path)
    keep = referenced(root)
    before = tree(root)

    # Young (a running ingest's files look the same): nothing goes by default.
    r = run_cli("datasets", "gc", "--all", "--root", str(root), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "" and tree(root) == before, r.stderr
    assert "alpha: removed 0 file(s), 0 bytes" in r.stderr and "younger than the grace age" in r.stderr

    # --dry-run names what would go, with the bytes, and removes nothing.
    r = run_cli("datasets", "gc", "alpha", "--dry-run", "--min-age", "0", "--root", str(root), cwd=tmp_path)
    assert r.returncode == 0 and tree(root) == before, r.stderr
    lines = r.stdout.splitlines()
    would = {line.split()[2]: int(line.split()[3]) for line in lines if line.endswith("old)")}
    orphan_key = orphan.relative_to(root).as_posix()
    assert f"would remove  {orphan_key}/  (empty ingest directory)" in lines
    assert {k for k in would if k.startswith(orphan_key)} == {f"{orphan_key}/{n}" for n in left}
    assert temp.relative_to(root).as_posix() in would and not set(would) & set(keep)
    assert f"would remove {len(would)} file(s), {orphan_bytes + temp.stat().st_size} bytes" in r.stderr
    assert "1 outside ingest directories" in r.stderr

    # An hour later: gone, with their directories; what manifests reference and the foreign file stay.
    for p in (orphan, temp, fresh, empty):
        age(p, 2 * HOUR_S)
    r = run_cli("datasets", "gc", "--all", "--root", str(root), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = {d["name"]: d for d in json.loads(r.stdout)["datasets"]}
    assert report["alpha"]["bytes"] == orphan_bytes + len('{"format": 1, "na')
    assert report["alpha"]["dirs"] == [orphan_key] and report["beta"]["dirs"] == [
        empty.relative_to(root).as_posix()
    ]
    assert [f["key"] for f in report["fresh"]["removed"]] == [f"{fresh.relative_to(root)}/part-00000.parquet"]
    assert [f["key"] for f in report["alpha"]["kept_outside_ingest_dirs"]] == [
        "alpha/data/2024-06/part-0.parquet"
    ]
    assert not orphan.exists() and not temp.exists() and not empty.exists() and not fresh.exists()
    assert foreign.exists()
    assert {k: v for k, v in tree(root).items() if k in keep} == keep

    # Everything referenced still verifies and reads through a real server; ingest goes on.
    for name in ("alpha", "beta", "gamma"):
        r = run_cli("datasets", "verify", name, "--root", str(root), "-q", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    with LocalServer(root) as server, Loader([server.target], "alpha@1", batch_size=50, shuffle=False) as ld:
        assert np.concatenate([b["id"] for b in ld]).tolist() == list(range(300))
    assert write_dataset(root, "alpha", 20).version == 3


def test_gc_spares_what_a_manifest_created_meanwhile_references(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_dataset(root, "ds", 100)
    done = write_dataset(tmp_path / "elsewhere", "ds", 50, start=100)
    # An ingest's shards, written long ago, whose manifest is created while gc looks (a slow ingest
    # finishing): gc lists the files, the version appears, gc must spare them.
    shard_dir = root / "ds" / "data" / done.shards[0].uri.split("/")[1]
    shard_dir.mkdir()
    for s in done.shards:
        (root / "ds" / s.uri).write_bytes((tmp_path / "elsewhere" / "ds" / s.uri).read_bytes())
    age(shard_dir, 2 * HOUR_S)
    reg = Registry(root)
    real_list_info = reg.storage.list_info

    def list_then_finish(prefix: str):  # type: ignore[no-untyped-def]
        listed = real_list_info(prefix)
        reg.create_version("ds", lambda v, p: replace(done, version=v))
        return listed

    reg.storage.list_info = list_then_finish  # type: ignore[method-assign]
    report = remove_orphans(reg, "ds")
    assert report.removed == [] and reg.versions("ds") == [1, 2]
    assert all((root / "ds" / s.uri).is_file() for s in reg.resolve("ds@2").shards)


def test_gc_leaves_a_dataset_alone_when_its_references_are_unknown(tmp_path: Path) -> None:
    root = tmp_path / "root"
    several_datasets(root)
    orphan = root / "gamma" / "data" / uuid.uuid4().hex
    orphan.mkdir()
    (orphan / "part-00000.parquet").write_bytes(b"x" * 100)
    age(orphan, 2 * HOUR_S)
    break_manifest(root, "gamma", 1, "truncated")  # an old version: still, its shards are unknown
    link_dataset(root, "delta", root / "beta")
    before = tree(root)
    r = run_cli("datasets", "gc", "--all", "--root", str(root), cwd=tmp_path)
    assert r.returncode == 1 and tree(root) == before
    assert "gamma skipped: gamma@1: its manifest is not valid JSON" in r.stderr
    assert "delta skipped: delta: its directory is a symbolic link" in r.stderr
    r = run_cli("datasets", "gc", "nothere", "--root", str(root), cwd=tmp_path)
    assert r.returncode == 1 and "no dataset directory named 'nothere'" in r.stderr


def test_gc_on_s3_removes_an_orphan_ingest_directory(s3_root: str, tmp_path: Path) -> None:
    src = tmp_path / "src.parquet"
    pq.write_table(make_table(300), src)
    m = ingest(src, "web", s3_root, IngestOptions(shard_rows=100, progress=False))
    # What an ingest killed during its upload leaves: some shards of its directory, no manifest.
    orphan = f"web/data/{uuid.uuid4().hex}"
    put_parquet(s3_root, f"{orphan}/part-00000.parquet", make_table(100), tmp_path)
    with open_storage(s3_root) as st:
        size = st.head(f"{orphan}/part-00000.parquet").size
        before = dict(st.list_info("web/"))

    r = run_cli("datasets", "gc", "web", "--root", s3_root, cwd=tmp_path)
    assert r.returncode == 0 and "younger than the grace age" in r.stderr, r.stderr
    r = run_cli("datasets", "gc", "web", "--root", s3_root, "--min-age", "0", "--dry-run", cwd=tmp_path)
    assert r.stdout.split()[:5] == ["would", "remove", f"{orphan}/part-00000.parquet", str(size), "bytes"]
    assert len(r.stdout.splitlines()) == 1, r.stdout
    r = run_cli("datasets", "gc", "web", "--root", s3_root, "--min-age", "0", cwd=tmp_path)
    assert r.returncode == 0 and f"removed 1 file(s), {size} bytes" in r.stderr, r.stderr
    with open_storage(s3_root) as st:
        after = dict(st.list_info("web/"))
    assert set(before) - set(after) == {f"{orphan}/part-00000.parquet"}
    with open_registry(s3_root) as reg:
        assert reg.resolve("web@1").fingerprint == m.fingerprint
    r = run_cli("datasets", "verify", "web", "--root", s3_root, "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("text", ["1h", "30m", "90", "90s", "2d", "0"])
def test_min_age_takes_units(text: str) -> None:
    assert duration(text) == {"1h": 3600, "30m": 1800, "90": 90, "90s": 90, "2d": 172800, "0": 0}[text]
