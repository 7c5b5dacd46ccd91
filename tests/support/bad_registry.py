"""Registry roots with entries that cannot be read, made the way they happen in practice, and an
ingest killed mid-way — the leftovers `datasets gc` exists for.

    several_datasets(root)   alpha (2 versions), beta (1), gamma (2): the datasets the tests break
    break_manifest(root, name, version, kind)   one kind of unreadable manifest (MANIFEST_KINDS)
    link_dataset(root, name, target)            a dataset directory replaced by a symbolic link
    kill_ingest_midway(root, name, src)         a real `shardstream ingest` SIGKILLed while it writes
                                                shards; its orphan directory
    big_source(path)                            an input that ingest needs a while for
    tree(path)                                  {relative path: (size, mtime_ns)} of every file
    age(path, seconds)                          set a file's and its directory's mtime in the past

`denied` is the one kind made by FAULT INJECTION (tests run as root, whom file modes do not stop):
reading that one manifest raises PermissionError, as it would for a server running as another user.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from .data import make_table, write_dataset

__all__ = [
    "MANIFEST_KINDS",
    "age",
    "big_source",
    "break_manifest",
    "kill_ingest_midway",
    "link_dataset",
    "several_datasets",
    "tree",
]

MANIFEST_KINDS = (
    "truncated",  # a write cut short: half the JSON
    "garbage",  # overwritten with bytes that are not UTF-8 JSON
    "not_object",  # JSON, but a list
    "wrong_schema",  # a JSON object without the manifest's fields
    "fingerprint",  # edited by hand: content no longer matches its fingerprint
    "other_version",  # a copy of another version's manifest
    "link_outside",  # a symbolic link to a file outside the root
    "link_inside",  # a symbolic link to another manifest of the root
    "denied",  # not readable by the server (fault injection, see the module docstring)
)


def several_datasets(root: Path) -> None:
    """alpha@1, alpha@2, beta@1, gamma@1, gamma@2 under `root` (real ingests)."""
    write_dataset(root, "alpha", 300, shard_rows=120)
    write_dataset(root, "alpha", 200, shard_rows=120, start=1000)
    write_dataset(root, "beta", 150, shard_rows=100)
    write_dataset(root, "gamma", 120, shard_rows=100)
    write_dataset(root, "gamma", 80, shard_rows=100, start=500)


def break_manifest(
    root: Path, name: str, version: int, kind: str, monkeypatch: pytest.MonkeyPatch | None = None
) -> Path:
    """Make `name@version`'s manifest unreadable in the way `kind` says; its path."""
    path = root / name / "manifests" / f"{version}.json"
    text = path.read_text()
    if kind == "truncated":
        path.write_text(text[: len(text) // 2])
    elif kind == "garbage":
        path.write_bytes(b"\xff\xfe\x00garbage" * 10)
    elif kind == "not_object":
        path.write_text("[1, 2, 3]\n")
    elif kind == "wrong_schema":
        path.write_text(json.dumps({"format": 1, "name": name, "version": version}))
    elif kind == "fingerprint":
        d = json.loads(text)
        d["shards"][0]["sha256"] = "0" * 64
        path.write_text(json.dumps(d))
    elif kind == "other_version":
        other = root / name / "manifests" / f"{1 if version != 1 else 2}.json"
        path.write_text(other.read_text())
    elif kind in ("link_outside", "link_inside"):
        target = root.parent / f"outside-{name}-{version}.json" if kind == "link_outside" else None
        if target is not None:
            target.write_text(text)
        else:
            target = root / name / "manifests" / f"{1 if version != 1 else 2}.json"
        path.unlink()
        os.symlink(target, path)
    elif kind == "denied":
        assert monkeypatch is not None, "denied needs monkeypatch (fault injection)"
        real = Path.read_bytes
        victim = path.resolve()

        def read_bytes(self: Path) -> bytes:
            if self.resolve() == victim:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)

        monkeypatch.setattr(Path, "read_bytes", read_bytes)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return path


def link_dataset(root: Path, name: str, target: Path) -> Path:
    """`root/name` as a symbolic link to the directory `target`."""
    os.symlink(target, root / name, target_is_directory=True)
    return root / name


def tree(path: Path) -> dict[str, tuple[int, int]]:
    return {
        p.relative_to(path).as_posix(): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def age(path: Path, seconds: float) -> None:
    """Backdate `path` (a file or a directory, and everything under a directory) by `seconds`."""
    when = time.time() - seconds
    for p in [path, *(path.rglob("*") if path.is_dir() else [])]:
        os.utime(p, (when, when))


def kill_ingest_midway(root: Path, name: str, src: Path, timeout_s: float = 120.0) -> Path:
    """Run `shardstream ingest SRC --name NAME --root ROOT` (small shards, so it writes many) and
    SIGKILL its process group once it has written a shard; the ingest directory it leaves."""
    data = root / name / "data"
    before = set(data.iterdir()) if data.is_dir() else set()
    cmd = [sys.executable, "-m", "shardstream", "ingest", str(src), "--name", name, "--root", str(root)]
    cmd += ["--shard-rows", "500", "--row-group-rows", "250", "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            new = set(data.iterdir()) - before if data.is_dir() else set()
            if any(d.is_dir() and any(d.glob("part-*.parquet")) for d in new):
                break
            if proc.poll() is not None:
                raise AssertionError(f"ingest ended before it could be killed: {proc.communicate()}")
            if time.monotonic() > deadline:
                raise AssertionError("ingest wrote no shard in time")
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    (orphan,) = set(data.iterdir()) - before
    return orphan


def big_source(path: Path, rows: int = 400_000) -> Path:
    """A Parquet input large enough for an ingest of 500-row shards to take a while."""
    pq.write_table(make_table(rows), path)
    return path
