"""The checkpoint commit protocol over real storage (a local directory and the local S3 server):
committed = manifest present; partial saves never listed; gc reclaims; the format round-trips."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from shardstream.checkpoint_format import (
    FORMAT,
    PART_KIND,
    TensorRef,
    chunk_hash,
    chunk_key,
    decode_value,
    encode_value,
    part_key,
)
from shardstream.errors import DataLossError, FailedPreconditionError, InvalidArgumentError, NotFoundError
from shardstream.server.checkpoints import CheckpointStore, collect, open_checkpoint_store


def _part(job: str, step: int, rank: int, world: int, chunks: list[bytes], save_id: str = "s") -> dict:
    return {
        "kind": PART_KIND,
        "format": FORMAT,
        "job": job,
        "step": step,
        "rank": rank,
        "world_size": world,
        "save_id": save_id,
        "tensors": {
            "0": {
                "path": f"w{rank}",
                "kind": "numpy",
                "dtype": "|u1",
                "shape": [sum(map(len, chunks))],
                "nbytes": sum(map(len, chunks)),
                "chunks": [[chunk_hash(c), len(c)] for c in chunks],
            }
        },
        "objects": encode_value({"w": TensorRef("0"), "lr": 0.1}),
        "loader": {"offset": step},
    }


def _save(store: CheckpointStore, job: str, step: int, world: int, data: dict[int, list[bytes]]) -> dict:
    out = {}
    for rank in range(world):
        for c in data[rank]:
            store.put_chunk(job, chunk_hash(c), c)
        store.put_part(job, step, rank, _part(job, step, rank, world, data[rank]))
        out = store.commit(job, step, world, "s")
    return out


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    if request.param == "local":
        return open_checkpoint_store(tmp_path / "ckpt")
    return open_checkpoint_store(request.getfixturevalue("s3_root"))


def test_values_round_trip_exactly() -> None:
    value = {1: (2, [3.5, None, True]), "t": TensorRef("7"), "inf": math.inf, "tensor": "x", 0.5: "f"}
    back = decode_value(encode_value(value))
    assert back == value
    assert isinstance(back[1], tuple) and isinstance(back[1][1], list) and isinstance(back["t"], TensorRef)
    with pytest.raises(InvalidArgumentError, match="set"):
        encode_value({"a": {1, 2}})


def test_a_step_is_committed_only_when_every_rank_and_chunk_is_there(store: CheckpointStore) -> None:
    job = "run-1"
    chunks = {0: [b"a" * 100, b"b" * 50], 1: [b"c" * 10]}
    store.put_chunk(job, chunk_hash(chunks[0][0]), chunks[0][0])
    store.put_part(job, 5, 0, _part(job, 5, 0, 2, chunks[0]))
    # rank 1 missing: waiting; and never listed
    assert store.commit(job, 5, 2, "s") == {"committed": False, "waiting_for": [1], "waiting": 1, "missing": []}
    assert store.steps(job) == []
    store.put_part(job, 5, 1, _part(job, 5, 1, 2, chunks[1]))
    out = store.commit(job, 5, 2, "s")
    assert not out["committed"]
    assert sorted(out["missing"]) == sorted([chunk_hash(chunks[0][1]), chunk_hash(chunks[1][0])])
    assert store.steps(job) == []
    for c in [chunks[0][1], chunks[1][0]]:
        store.put_chunk(job, chunk_hash(c), c)
    assert store.commit(job, 5, 2, "s")["committed"]
    assert store.steps(job) == [5] and store.latest(job) == 5
    manifest = store.manifest(job, 5)
    assert [p["loader"] for p in manifest["parts"]] == [{"offset": 5}, {"offset": 5}]
    assert manifest["bytes"] == 160
    assert store.verify(job, 5) == []
    # committed once: another save of that step is refused; a retry of the same commit is fine
    assert store.commit(job, 5, 2, "s")["committed"]
    with pytest.raises(FailedPreconditionError):
        store.put_part(job, 5, 0, _part(job, 5, 0, 2, chunks[0]))
    with pytest.raises(FailedPreconditionError):
        store.commit(job, 5, 2, "other")


def test_parts_of_different_saves_never_commit_together(store: CheckpointStore) -> None:
    job = "mix"
    data = [b"x" * 10]
    store.put_chunk(job, chunk_hash(data[0]), data[0])
    store.put_part(job, 1, 0, _part(job, 1, 0, 2, data, save_id="old"))
    store.put_part(job, 1, 1, _part(job, 1, 1, 2, data, save_id="new"))
    assert store.commit(job, 1, 2, "new")["waiting_for"] == [0]
    assert store.steps(job) == []


def test_damaged_chunks_are_refused_and_corrupt_ones_are_data_loss(store: CheckpointStore) -> None:
    job = "integrity"
    data = b"payload" * 100
    h = chunk_hash(data)
    with pytest.raises(DataLossError, match="damaged"):
        store.put_chunk(job, h, data[:-1] + b"X")
    assert store.put_chunk(job, h, data) and not store.put_chunk(job, h, data)  # content addressed
    assert store.read_chunk(job, h) == data
    store.put_part(job, 3, 0, _part(job, 3, 0, 1, [data]))
    assert store.commit(job, 3, 1, "s")["committed"]
    flipped = bytearray(data)
    flipped[17] ^= 0x01
    store.storage.put(chunk_key(job, h), bytes(flipped))
    with pytest.raises(DataLossError, match=f"chunk {h}"):
        store.read_chunk(job, h)
    problems = store.verify(job, 3)
    assert len(problems) == 1 and "'w0'" in problems[0] and "corrupt" in problems[0]
    with pytest.raises(NotFoundError):
        store.manifest(job, 4)


@pytest.mark.parametrize("keep", [1, 2])
def test_gc_keeps_the_newest_and_reclaims_the_rest(tmp_path: Path, keep: int) -> None:
    store = open_checkpoint_store(tmp_path / "ckpt")
    job = "gcjob"
    shared = b"s" * 64
    for step in range(4):
        _save(store, job, step, 1, {0: [shared, bytes([step]) * 32]})
    # chunks of a save that died (old) and of one still running (step 9, its part written)
    dead, running = b"d" * 16, b"r" * 16
    for c in (dead, running):
        store.put_chunk(job, chunk_hash(c), c)
    store.storage.put(part_key(job, 1, 0), b"{}")  # leftover of a committed step
    store.put_part(job, 9, 0, _part(job, 9, 0, 2, [running]))
    orphan = b"o" * 8  # uploaded, never named by any part
    store.put_chunk(job, chunk_hash(orphan), orphan)
    old = time.time() - 7200
    for key in store.storage.list(f"{job}/chunks/"):
        if key.endswith((chunk_hash(dead), chunk_hash(orphan))):
            os.utime(tmp_path / "ckpt" / key, (old, old))
    report = collect(store, job, keep=keep)
    assert store.steps(job) == list(range(4 - keep, 4))
    assert report.removed_steps == list(range(4 - keep))
    for step in store.steps(job):
        assert store.verify(job, step) == []  # everything the kept steps name is still there
    left = {k.rpartition("/")[2] for k in store.storage.list(f"{job}/chunks/")}
    assert chunk_hash(shared) in left and chunk_hash(running) in left  # named by a running save's part
    assert chunk_hash(dead) not in left and chunk_hash(orphan) not in left
    for step in range(4 - keep):
        assert chunk_hash(bytes([step]) * 32) not in left
    assert store.storage.list(f"{job}/parts/") == [part_key(job, 9, 0)]
    with pytest.raises(InvalidArgumentError):
        collect(store, job, keep=0)
