"""Durability (DESIGN §3): `ingest` and `register` fsync the shards, the manifest and every directory
on the way up to the root before they print NAME@VERSION — observed from outside, with strace on a
real `shardstream` process (its fsync calls, the files behind their descriptors, and the order
against the write of NAME@VERSION to stdout)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shardstream.registry import Registry

from .support.data import make_table

pytestmark = pytest.mark.skipif(
    shutil.which("strace") is None, reason="needs strace (apt-get install strace)"
)

FSYNC = re.compile(r"^\d+ +f(?:data)?sync\(\d+<(?P<path>[^>]+)>\) += 0")
PRINTED = re.compile(r'^\d+ +write\(1<[^>]*>, "(?P<text>[^"\\]*)')  # the first write to stdout


def traced(tmp_path: Path, *argv: str) -> tuple[list[str], str]:
    """Run `shardstream ARGV` under strace; (paths fsynced before the first line printed, that line)."""
    log = tmp_path / "strace.log"
    cmd = ["strace", "-f", "-y", "-qq", "-s", "256", "-o", str(log), "-e", "trace=fsync,fdatasync,write"]
    p = subprocess.run(
        [*cmd, sys.executable, "-m", "shardstream", *argv], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    synced: list[str] = []
    for line in log.read_text().splitlines():
        m = FSYNC.match(line)
        if m:
            synced.append(m.group("path"))
            continue
        m = PRINTED.match(line)
        if m:
            assert m.group("text") == p.stdout.strip()
            return synced, m.group("text")
    raise AssertionError(f"no NAME@VERSION written: {p.stdout!r}")


def chain(root: Path, path: Path) -> set[str]:
    """`path`'s directory and every one above it up to the root."""
    out, d = set(), path.parent
    while True:
        out.add(str(d))
        if d == root:
            return out
        d = d.parent


def test_ingest_syncs_shards_manifest_and_directories_before_printing(tmp_path: Path) -> None:
    root = (tmp_path / "root").resolve()
    src = tmp_path / "in.parquet"
    pq.write_table(make_table(500), src)
    synced, printed = traced(
        tmp_path, "ingest", str(src), "--name", "toy", "--root", str(root), "--shard-rows", "200", "-q"
    )
    assert printed == "toy@1"
    m = Registry(root).resolve("toy@1")
    shards = [root / "toy" / s.uri for s in m.shards]
    manifest = root / "toy" / "manifests" / "1.json"
    need = {str(p) for p in shards} | set().union(*(chain(root, p) for p in [*shards, manifest]))
    assert need <= set(synced), sorted(need - set(synced))
    # the manifest's bytes: its private temp file, fsynced before it was linked into place
    assert any(
        re.fullmatch(rf"{re.escape(str(manifest.parent))}/\.1\.json\.[0-9a-f]{{32}}\.tmp", p) for p in synced
    )


def test_register_syncs_the_files_it_registers_and_the_manifest_before_printing(tmp_path: Path) -> None:
    root = (tmp_path / "root").resolve()
    run = root / "bring" / "data" / "run1"
    run.mkdir(parents=True)
    for i in range(3):
        pq.write_table(make_table(50, 50 * i), run / f"part-{i}.parquet")  # as Spark would: not synced
    synced, printed = traced(tmp_path, "register", "bring", "--from", "data/run1", "--root", str(root), "-q")
    assert printed == "bring@1"
    manifest = root / "bring" / "manifests" / "1.json"
    files = sorted(run.glob("part-*.parquet"))
    need = {str(p) for p in files} | chain(root, files[0]) | chain(root, manifest)
    assert need <= set(synced), sorted(need - set(synced))
