"""Decode once for many jobs (server/read/feature_cache.py): the shared head of a pipeline changes no byte.

Every Read message of a server whose deterministic transforms come from the feature cache must be
byte for byte the message of a server that runs them on every message: over pipelines (a decode
alone, a decode then a random crop and flip, tokenize then pack, bad samples skipped or failing),
shuffle modes, seeds, epochs, world sizes, batch sizes and mixtures; computed here, loaded from the
disk tier by another process, and after a damaged file. Through the planner and message builder in
this process (many cases), and through real `shardstream serve` processes: two workers sharing one
`--cache-dir` compute each row group's decode once for three jobs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest
from prometheus_client import REGISTRY

from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.manifest import DatasetRef
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.read import feature_cache, spill
from shardstream.server.read.build import MessageBuilder
from shardstream.server.read.plan import ReadPlanner
from shardstream.server.read.reader import DatasetReader, new_row_group_cache
from shardstream.server.read.request_limits import RequestLimits
from shardstream.server.read.spill import SUFFIX, TRAILER_BYTES, SpillTier
from shardstream.transform_spec import to_wire
from shardstream.v1 import shardstream_pb2 as pb

from .support import media
from .support.doget import wire_messages
from .support.servers import scrape, wait_for

DECODE = [{"op": "image.decode", "size": [40, 48]}]
DECODE_THEN_AUGMENT = [
    {"op": "image.decode", "size": [56, 56], "crop": "none"},
    {"op": "image.crop", "size": [40, 48], "crop": "random", "hflip": True},
]
DECODE_RANDOM = [{"op": "image.decode", "size": [32, 32], "crop": "random", "hflip": True}]  # nothing shared
TOKENIZE_PACK = [{"op": "text.tokenize"}, {"op": "text.pack", "seq_len": 96}]
TOKENIZE = [{"op": "text.tokenize", "output": "ids"}]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("features") / "root"
    images = media.real_images()
    media.write_table(
        root, "images", media.blob_table("image", images, repeat=3), row_group_rows=7, shard_rows=28
    )
    media.write_table(root, "images_b", media.blob_table("image", images[::-1], repeat=2), row_group_rows=5)
    jpeg = next(b for n, b in images if n.endswith(".jpeg"))
    mixed = [images[i % len(images)] for i in range(18)]
    for k, bad in enumerate(
        [("truncated.jpeg", jpeg[: len(jpeg) // 3]), ("empty", b""), ("text", b"not an image")]
    ):
        mixed.insert(2 + 5 * k, bad)
    media.write_table(root, "badimages", media.blob_table("image", mixed), row_group_rows=4, shard_rows=12)
    src = media.python_sources(30)
    media.write_table(root, "text", pa.table({"idx": np.arange(len(src)), "text": [t for _, t in src]}))
    return root


def request(dataset: str | dict[str, float], transforms: list[dict[str, Any]], **kw: Any) -> pb.ReadRequest:
    kw.setdefault("world_size", 1)
    kw.setdefault("batch_size", 6)
    shuffle = kw.pop("shuffle", "none")
    on_error = kw.pop("on_error", "fail")
    req = pb.ReadRequest(
        shuffle=pb.Shuffle(mode=shuffle), transforms=to_wire(transforms), on_error=on_error, **kw
    )
    if isinstance(dataset, str):
        req.dataset = dataset
    else:
        for name, weight in dataset.items():
            req.mixture.add(dataset=name, weight=weight)
    return req


class Planned:
    """A planner and builder as a server process has them, with or without a disk tier."""

    def __init__(self, root: Path, cache_dir: Path | None = None) -> None:
        spill = SpillTier(cache_dir) if cache_dir else None
        self.planner = ReadPlanner(Registry(root), new_row_group_cache(1 << 30, spill))
        self.builder = MessageBuilder(transform_threads=2)

    def messages(self, req: pb.ReadRequest) -> list[tuple[bytes, bytes]]:
        """The stream's messages as (header, IPC stream) bytes: byte-identical streams compare equal."""
        return [m.wire() for m in self.builder.stream(self.planner.plan(req))]


@pytest.fixture(scope="module")
def plain(root: Path) -> Planned:
    return Planned(root)


def counter(name: str) -> float:
    """This process's shardstream_feature_cache_{name}_total."""
    return REGISTRY.get_sample_value(f"shardstream_feature_cache_{name}_total") or 0.0


def feature_files(d: Path) -> list[Path]:
    return sorted(d.glob(f"feat-*{SUFFIX}"))


CASES = [
    ("images", DECODE, {}),
    ("images", DECODE, {"shuffle": "block", "seed": 3, "world_size": 2, "rank": 1, "batch_size": 5}),
    ("images", DECODE_THEN_AUGMENT, {"shuffle": "full", "seed": 11, "epoch": 2, "batch_size": 9}),
    ("images", DECODE_THEN_AUGMENT, {"shuffle": "block", "seed": 12, "world_size": 3, "rank": 2}),
    ("images", DECODE_RANDOM, {"shuffle": "full", "seed": 4}),
    ("badimages", DECODE, {"on_error": "skip", "shuffle": "full", "seed": 5, "batch_size": 4}),
    ("badimages", DECODE_THEN_AUGMENT, {"on_error": "skip", "shuffle": "block", "seed": 6, "world_size": 2}),
    ("text", TOKENIZE_PACK, {"shuffle": "block", "seed": 7, "batch_size": 4}),
    ("text", TOKENIZE, {"shuffle": "full", "seed": 8, "columns": ["idx", "text"], "start_offset": 5}),
    ({"images": 0.6, "images_b": 0.4}, DECODE_THEN_AUGMENT, {"shuffle": "full", "seed": 9, "batch_size": 7}),
]


@pytest.mark.parametrize(("dataset", "transforms", "kw"), CASES)
def test_shared_head_changes_no_byte(
    root: Path,
    plain: Planned,
    tmp_path: Path,
    dataset: Any,
    transforms: list[dict[str, Any]],
    kw: dict[str, Any],
) -> None:
    req = request(dataset, transforms, **kw)
    want = plain.messages(req)
    shared = Planned(root, tmp_path / "cache")
    assert shared.messages(req) == want  # computed here, row group by row group
    assert shared.messages(req) == want  # from memory
    other = Planned(root, tmp_path / "cache")  # another process on the same node: from the disk tier
    assert other.messages(req) == want
    files = feature_files(tmp_path / "cache")
    if transforms is DECODE_RANDOM:
        assert not files  # no deterministic head: nothing shared
    else:
        assert files


@pytest.mark.parametrize("seed", range(4))
def test_jobs_with_other_seeds_reuse_one_decode(
    root: Path, plain: Planned, tmp_path: Path, seed: int
) -> None:
    shared = Planned(root, tmp_path / "cache")
    misses = counter("misses")
    first = request("images", DECODE_THEN_AUGMENT, shuffle="full", seed=100)
    assert shared.messages(first) == plain.messages(first)
    computed = counter("misses") - misses
    groups = len(feature_files(tmp_path / "cache"))
    assert computed == groups > 0  # every row group once
    for rank in range(2):
        req = request(
            "images", DECODE_THEN_AUGMENT, shuffle="block", seed=seed, world_size=2, rank=rank, epoch=seed
        )
        assert shared.messages(req) == plain.messages(req)
    assert counter("misses") - misses == computed  # nothing decoded again


@pytest.mark.parametrize(
    ("dataset", "transforms", "kw"), [c for c in CASES if c[1] is not DECODE_RANDOM]
)
def test_a_shared_head_takes_no_stored_bytes(
    root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    dataset: Any,
    transforms: list[dict[str, Any]],
    kw: dict[str, Any],
) -> None:
    """Once the feature cache holds a row group's head, a message of its rows locates them and
    never takes their stored columns (a JPEG's bytes: DatasetReader.take); where the head is not
    shared (a row group over the limit), every message takes them as before."""
    req = request(dataset, transforms, **kw)
    shared = Planned(root, tmp_path / "cache")
    want = shared.messages(req)  # computes the heads
    taken: list[int] = []  # rows taken, a call each (the end of the epoch takes none)
    real = DatasetReader.take
    monkeypatch.setattr(DatasetReader, "take", lambda self, rows, *a, **k: taken.append(len(rows)) or real(self, rows, *a, **k))
    assert shared.messages(req) == want  # from memory
    assert Planned(root, tmp_path / "cache").messages(req) == want  # from the disk tier
    assert not any(taken)
    monkeypatch.setattr(feature_cache, "MAX_GROUP_BYTES", 1)
    assert Planned(root, tmp_path / "other").messages(req) == want
    assert sum(taken) > 0


def test_a_failing_sample_fails_the_same_message_the_same_way(
    root: Path, plain: Planned, tmp_path: Path
) -> None:
    req = request("badimages", DECODE, shuffle="block", seed=2, batch_size=3)
    with pytest.raises(DataLossError) as want:
        plain.messages(req)
    shared = Planned(root, tmp_path / "cache")
    for _ in range(2):  # computing the row groups, then from memory
        with pytest.raises(DataLossError) as got:
            shared.messages(req)
        assert str(got.value) == str(want.value)
    # The messages before the failing one are the same too.
    plan_a, plan_b = plain.planner.plan(req), shared.planner.plan(req)
    it_a, it_b = plain.builder.stream(plan_a), shared.builder.stream(plan_b)
    while True:
        try:
            a = next(it_a)
        except DataLossError:
            with pytest.raises(DataLossError):
                next(it_b)
            break
        assert next(it_b).wire() == a.wire()


def test_a_damaged_file_is_computed_again_never_served(root: Path, plain: Planned, tmp_path: Path) -> None:
    req = request("images", DECODE, shuffle="full", seed=1)
    want = plain.messages(req)
    assert Planned(root, tmp_path / "cache").messages(req) == want
    files = feature_files(tmp_path / "cache")
    for f in files:  # one bit flipped in the middle of every file
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
    misses = counter("misses")
    assert Planned(root, tmp_path / "cache").messages(req) == want
    assert counter("misses") - misses == len(files)


def test_a_row_group_over_the_limit_is_not_shared(
    root: Path, plain: Planned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feature_cache, "MAX_GROUP_BYTES", 1000)  # smaller than one decoded image
    req = request("images", DECODE_THEN_AUGMENT, shuffle="block", seed=8)
    bypassed = counter("bypassed")
    assert Planned(root, tmp_path / "cache").messages(req) == plain.messages(req)
    assert not feature_files(tmp_path / "cache")
    assert counter("bypassed") > bypassed


def test_row_groups_read_through_the_tier_while_sharing_its_only_lock(
    root: Path, plain: Planned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row group the head needs is read (under the tier's lock) before the head's own file is
    locked: with one lock stripe for every file and nothing kept in memory or on disk, nothing
    waits on itself."""
    monkeypatch.setattr(spill, "LOCK_STRIPES", 1)
    shared = Planned(root, tmp_path / "cache")
    tier = SpillTier(tmp_path / "cache", capacity_bytes=1)  # every file evicted once written
    shared.planner = ReadPlanner(Registry(root), new_row_group_cache(1, tier))
    req = request("images", DECODE_THEN_AUGMENT, shuffle="full", seed=3)
    got: list[list[bytes]] = []
    worker = threading.Thread(target=lambda: got.append(shared.messages(req)), daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the stream waits on the tier's lock it holds"
    assert got == [plain.messages(req)]


def test_the_sample_limit_still_refuses_large_outputs(root: Path, tmp_path: Path) -> None:
    shared = Planned(root, tmp_path / "cache")
    shared.planner.limits = RequestLimits(max_sample_bytes=10_000)
    with pytest.raises(InvalidArgumentError, match="over this server's limit"):
        shared.planner.plan(request("images", [{"op": "image.decode", "size": [100, 100]}]))
    assert not feature_files(tmp_path / "cache")


def test_other_parameters_are_other_files(root: Path, tmp_path: Path) -> None:
    shared = Planned(root, tmp_path / "cache")
    shared.messages(request("images", DECODE))
    n = len(feature_files(tmp_path / "cache"))
    shared.messages(request("images", [{"op": "image.decode", "size": [40, 48], "resample": "bicubic"}]))
    assert len(feature_files(tmp_path / "cache")) == 2 * n


# --- through real servers ---------------------------------------------------------------------
def raw_messages(server: LocalServer, req: pb.ReadRequest) -> list[tuple[bytes, bytes]]:
    """A Read on `server`'s data plane (a worker's), as wire bytes."""
    with grpc.insecure_channel(server.target) as channel:
        return wire_messages(channel, req)


@pytest.fixture(scope="module")
def servers(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalServer, LocalServer, Path]]:
    cache = tmp_path_factory.mktemp("node-cache")
    plain_server = LocalServer(root, extra_args=("--transform-threads", "2"))
    shared_server = LocalServer(
        root, workers=2, metrics=True, extra_args=("--transform-threads", "2", "--cache-dir", str(cache))
    )
    try:
        yield plain_server.start(), shared_server.start(), cache
    finally:
        shared_server.stop()
        plain_server.stop()


def test_three_jobs_on_two_workers_decode_each_row_group_once(
    servers: tuple[LocalServer, LocalServer, Path],
) -> None:
    plain_server, shared_server, cache = servers
    jobs = [
        request("images", DECODE_THEN_AUGMENT, shuffle="block", seed=seed, world_size=2, rank=rank)
        for seed in (1, 2, 3)
        for rank in range(2)
    ]
    for req in jobs:  # each call on a new channel: the kernel spreads them over the two workers
        assert raw_messages(shared_server, req) == raw_messages(plain_server, req)
    groups = len(feature_files(cache))
    manifest = Registry(shared_server.root).resolve(DatasetRef.parse("images"))
    assert groups == sum(len(s.row_groups) for s in manifest.shards)  # every row group, once

    def counted() -> bool:
        m = scrape(shared_server)
        return m.get("shardstream_feature_cache_misses_total", 0) == groups

    wait_for(counted, "the workers' metrics")
    m = scrape(shared_server)
    assert m["shardstream_feature_cache_hits_total"] > 0
    # Another pipeline and a mixture through the same server, still byte for byte.
    for req in (
        request("badimages", DECODE, on_error="skip", shuffle="full", seed=4),
        request({"images": 0.5, "images_b": 0.5}, DECODE, shuffle="full", seed=5, batch_size=8),
        request("text", TOKENIZE_PACK, shuffle="block", seed=6),
    ):
        assert raw_messages(shared_server, req) == raw_messages(plain_server, req)


def test_head_errors_travel_in_the_file(root: Path, tmp_path: Path) -> None:
    Planned(root, tmp_path / "cache").messages(request("badimages", DECODE, on_error="skip"))
    recorded = []
    for f in feature_files(tmp_path / "cache"):
        body = pa.py_buffer(f.read_bytes()[:-TRAILER_BYTES])
        meta = pa.ipc.open_file(body).schema.metadata or {}
        recorded += json.loads(meta[b"shardstream.head_errors"])
    assert len(recorded) == 3 and all(j == 0 for _, j, _ in recorded)
