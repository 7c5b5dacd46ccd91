"""Plan and build without a server: ReadRequest -> ReadPlan -> messages, no gRPC, no event loop.

The data plane only adapts `ReadPlanner` and `MessageBuilder` to Flight, so what a stream carries is
decided here: every message is checked against the pure read plan (`StepLayout`, `DatasetOrder`)
over seeds, world sizes, batch sizes and shuffle modes; a bad request fails at planning with the
error that names it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shardstream.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ShardstreamError,
)
from shardstream.ipc import read_ipc
from shardstream.order.read_order import DatasetOrder, RowLocator, ShuffleSpec, StepLayout
from shardstream.server.backends.roots import open_registry
from shardstream.server.read.build import MessageBuilder
from shardstream.server.read.message_steps import MAX_STEPS_PER_MESSAGE, Message
from shardstream.server.read.plan import ReadPlan, ReadPlanner
from shardstream.server.read.reader import new_row_group_cache
from shardstream.v1 import shardstream_pb2 as pb

from .support import media
from .support.data import write_dataset

N = 257  # prime: steps straddle row groups (20 rows) and shards (70 rows) everywhere
OTHER_START = 10_000
BAD_IMAGES = {2, 7, 8}  # rows of `imgs` that are not images


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("read-build") / "root"
    write_dataset(root, "toy", N, row_group_rows=20, shard_rows=70)
    write_dataset(root, "other", 101, row_group_rows=20, shard_rows=70, start=OTHER_START)
    items = [
        (f"bad-{i}", b"not an image") if i in BAD_IMAGES else (f"ok-{i}", media.random_png(i))
        for i in range(12)
    ]
    media.write_table(root, "imgs", media.blob_table("image", items), row_group_rows=4, shard_rows=8)
    return root


@pytest.fixture
def planner(root: Path) -> Iterator[ReadPlanner]:
    with open_registry(str(root)) as registry:
        yield ReadPlanner(registry, new_row_group_cache(64 << 20))


def request(
    dataset: str = "toy", *, shuffle: str = "none", transforms: Sequence[dict[str, Any]] = (), **fields: Any
) -> pb.ReadRequest:
    fields = {"world_size": 1, "batch_size": 8, **fields}
    req = pb.ReadRequest(dataset=dataset, **fields)
    req.shuffle.mode = shuffle
    for t in transforms:
        params = {k: v for k, v in t.items() if k != "op"}
        req.transforms.add(op=t["op"], params_json=json.dumps(params))
    return req


def decode(message: Message) -> tuple[pb.ReadHeader, pa.RecordBatch]:
    """A message as a client receives it: its header, and its rows through an IPC round trip."""
    header_bytes, ipc = message.wire()
    return pb.ReadHeader.FromString(header_bytes), read_ipc(pa.py_buffer(ipc))


def stream(planner: ReadPlanner, req: pb.ReadRequest, **builder: int) -> tuple[ReadPlan, list[Message]]:
    plan = planner.plan(req)
    return plan, MessageBuilder(**builder).messages(plan)


def shard_starts(planner: ReadPlanner, dataset: str) -> np.ndarray:
    manifest = planner.resolve(dataset)
    return np.concatenate([[0], np.cumsum([s.rows for s in manifest.shards])])


# --- messages follow the read plan ----------------------------------------------------------------
@pytest.mark.parametrize("shuffle", ["none", "block", "full"])
@pytest.mark.parametrize(
    ("seed", "world_size", "batch_size", "drop_last"),
    [
        (0, 1, 8, False),
        (1, 2, 5, False),
        (2, 3, 7, True),
        (3, 4, 1, False),
        (5, 4, 16, True),
        (7, 5, 64, True),
    ],
)
def test_messages_follow_the_step_layout(
    planner: ReadPlanner, shuffle: str, seed: int, world_size: int, batch_size: int, drop_last: bool
) -> None:
    manifest = planner.resolve("toy")
    spec = ShuffleSpec.parse(shuffle, None)
    block_sizes = RowLocator([s.row_groups for s in manifest.shards]).block_sizes
    order = DatasetOrder(manifest.fingerprint, block_sizes, seed, spec)  # built here, not by the planner
    layout = StepLayout(N, 0, world_size, batch_size, drop_last)
    starts = shard_starts(planner, "toy")
    delivered: list[np.ndarray] = []
    for rank in range(world_size):
        req = request(
            seed=seed,
            epoch=1,
            shuffle=shuffle,
            rank=rank,
            world_size=world_size,
            batch_size=batch_size,
            drop_last=drop_last,
            max_message_bytes=4096,
        )
        plan, messages = stream(planner, req)
        assert plan.layout == layout
        steps: list[int] = []
        for i, data in enumerate(messages):
            header, batch = decode(data)
            assert header.epoch == 1
            assert header.end_of_epoch == (i == len(messages) - 1)
            positions = []
            for st in header.steps:
                ps, pe = layout.rank_range(st.step, rank)
                assert (st.position_start, st.position_end) == (ps, pe)
                assert (st.global_start, st.global_end) == layout.global_range(st.step)
                assert st.rows == pe - ps and not st.skipped
                positions.append(np.arange(ps, pe))
                steps.append(st.step)
            pos = np.concatenate(positions) if positions else np.empty(0, np.int64)
            ids = batch.column("id").to_numpy()
            # the rows of the epoch's order at these positions, with the provenance that finds them again
            assert np.array_equal(ids, order.rows(1, pos))
            shard, row = batch.column("_shard").to_numpy(), batch.column("_row").to_numpy()
            assert np.array_equal(starts[shard] + row, ids)
            assert batch.schema.names == ["id", "x", "label", "text", "_shard", "_row"]
            delivered.append(ids)
        assert steps == list(range(layout.num_steps))
        assert decode(messages[-1])[0].dropped == layout.dropped
    got = np.sort(np.concatenate(delivered))
    # every sample of the epoch exactly once (less what drop_last leaves out), whatever the world size
    assert len(got) == N - layout.dropped and len(np.unique(got)) == len(got)
    assert set(got.tolist()) <= set(range(N))


@pytest.mark.parametrize(("start_offset", "first_step", "stride"), [(0, 1, 3), (100, 0, 2), (37, 2, 1)])
def test_strided_and_resumed_streams_cover_their_steps(
    planner: ReadPlanner, start_offset: int, first_step: int, stride: int
) -> None:
    layout = StepLayout(N, start_offset, 2, 6)
    plan, messages = stream(
        planner,
        request(
            seed=4,
            shuffle="block",
            start_offset=start_offset,
            first_step=first_step,
            step_stride=stride,
            rank=1,
            world_size=2,
            batch_size=6,
        ),
    )
    steps = [st.step for data in messages for st in decode(data)[0].steps]
    assert steps == list(range(first_step, layout.num_steps, stride))
    assert decode(messages[-1])[0].end_of_epoch


def test_num_steps_ends_the_stream_before_the_epoch(planner: ReadPlanner) -> None:
    plan, messages = stream(planner, request(first_step=3, num_steps=5, batch_size=4))
    headers = [decode(d)[0] for d in messages]
    assert [st.step for h in headers for st in h.steps] == [3, 4, 5, 6, 7]
    assert not any(h.end_of_epoch for h in headers)


@pytest.mark.parametrize("max_message_bytes", [1, 3000, 20_000, 1 << 30])
def test_message_sizes_follow_the_last_message(planner: ReadPlanner, max_message_bytes: int) -> None:
    _, messages = stream(planner, request(batch_size=3, max_message_bytes=max_message_bytes))
    counts = [len(decode(d)[0].steps) for d in messages]
    assert counts[0] == 1  # one step first, for a quick first batch
    left = sum(counts)
    for data, n, following in zip(messages, counts, counts[1:], strict=False):
        left -= n
        want = max(1, min(MAX_STEPS_PER_MESSAGE, max_message_bytes * n // data.nbytes))
        assert following == min(want, left)
    if max_message_bytes == 1:
        assert set(counts) == {1}
    if max_message_bytes == 1 << 30:
        assert len(counts) == 2  # the rest of the epoch in one message


def test_a_stream_with_nothing_left_says_the_epoch_is_over(planner: ReadPlanner) -> None:
    layout = StepLayout(N, 0, 2, 10, drop_last=True)
    plan, messages = stream(
        planner,
        request(first_step=layout.num_steps, world_size=2, batch_size=10, drop_last=True, columns=["id"]),
    )
    assert plan.nothing_left
    assert len(messages) == 1
    header, batch = decode(messages[0])
    assert header.end_of_epoch and header.dropped == layout.dropped == N % 20
    assert not header.steps and batch.num_rows == 0
    assert batch.schema.names == ["id", "_shard", "_row"]


def test_a_mixture_takes_each_row_from_its_source(planner: ReadPlanner) -> None:
    req = request("", seed=3, shuffle="block", batch_size=16, columns=["id", "label"], mixture_block=8)
    for name, weight in (("toy", 2.0), ("other", 1.0)):
        req.mixture.add(dataset=name, weight=weight)
    plan, messages = stream(planner, req)
    assert plan.mixture and len(plan.readers) == 2
    starts = [shard_starts(planner, "toy"), shard_starts(planner, "other")]
    sources = []
    for data in messages:
        header, batch = decode(data)
        pos = np.concatenate([np.arange(st.position_start, st.position_end) for st in header.steps])
        src, rows = plan.selector.select(plan.epoch, pos)
        got_src = batch.column("_source").to_numpy()
        ids = batch.column("id").to_numpy()
        assert np.array_equal(got_src, src)
        assert np.array_equal(ids, np.where(src == 1, rows + OTHER_START, rows))
        shard, row = batch.column("_shard").to_numpy(), batch.column("_row").to_numpy()
        for s in (0, 1):
            mine = src == s
            assert np.array_equal(starts[s][shard[mine]] + row[mine], rows[mine])
        sources.append(got_src)
    assert set(np.concatenate(sources).tolist()) == {0, 1}


# --- transforms -----------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_skipped_samples_are_named_per_step(planner: ReadPlanner, world_size: int) -> None:
    transforms = [{"op": "image.decode", "size": [4, 4]}]
    skipped: list[int] = []
    kept: list[int] = []
    for rank in range(world_size):
        req = request(
            "imgs",
            seed=1,
            shuffle="full",
            rank=rank,
            world_size=world_size,
            batch_size=2,
            columns=["idx", "image"],
            transforms=transforms,
            on_error="skip",
        )
        _, messages = stream(planner, req, transform_threads=2)
        for data in messages:
            header, batch = decode(data)
            assert batch.num_rows == sum(st.rows for st in header.steps)
            for st in header.steps:
                assert st.rows == st.position_end - st.position_start - len(st.skipped)
                for s in st.skipped:
                    assert st.position_start <= s.position < st.position_end
                    assert s.reason.startswith("image.decode:")
                    skipped.append(s.shard * 8 + s.row)  # 8 rows per shard
            kept += batch.column("idx").to_pylist()
            assert batch.schema.field("image").type != pa.binary()  # decoded
    assert sorted(skipped) == sorted(BAD_IMAGES)
    assert sorted(kept) == sorted(set(range(12)) - BAD_IMAGES)


def test_a_failing_transform_is_data_loss_naming_the_sample(planner: ReadPlanner) -> None:
    req = request(
        "imgs", batch_size=4, columns=["image"], transforms=[{"op": "image.decode", "size": [4, 4]}]
    )
    plan = planner.plan(req)  # the request is fine: the data is not
    with pytest.raises(DataLossError, match=r"image\.decode failed on imgs@1 shard 0 .* row 2"):
        list(MessageBuilder().messages(plan))


# --- bad requests fail at planning ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"rank": 2, "world_size": 2}, InvalidArgumentError, "rank must be in"),
        ({"world_size": 0}, InvalidArgumentError, "rank must be in"),
        ({"batch_size": 0}, InvalidArgumentError, "batch_size"),
        ({"start_offset": N + 1}, InvalidArgumentError, "outside the epoch"),
        ({"first_step": 10_000}, InvalidArgumentError, "past the epoch"),
        ({"columns": ["id", "nope"]}, InvalidArgumentError, "unknown column"),
        ({"columns": ["id", "id"]}, InvalidArgumentError, "listed twice"),
        ({"shuffle": "bogus"}, InvalidArgumentError, "unknown shuffle mode"),
        ({"transforms": [{"op": "no.such.op"}]}, InvalidArgumentError, "no.such.op"),
        ({"on_error": "ignore"}, InvalidArgumentError, "on_error"),
        ({"dataset": "nope"}, NotFoundError, "nope"),
        ({"dataset": "toy@9"}, NotFoundError, "toy"),
        ({"fingerprint": "0" * 64}, FailedPreconditionError, "changed under this job"),
    ],
)
def test_a_bad_request_fails_at_planning(
    planner: ReadPlanner, fields: dict[str, Any], error: type[ShardstreamError], match: str
) -> None:
    fields = {"dataset": "toy", **fields}
    with pytest.raises(error, match=match):
        planner.plan(request(**fields))


def test_a_bad_mixture_fails_at_planning(planner: ReadPlanner) -> None:
    req = request("")
    req.mixture.add(dataset="toy", weight=1.0)
    req.mixture.add(dataset="toy", weight=1.0)
    with pytest.raises(InvalidArgumentError, match="appears twice"):
        planner.plan(req)
    req = request("")
    req.mixture.add(dataset="toy", weight=1.0)
    req.mixture.add(dataset="other", weight=1.0, fingerprint="0" * 64)
    with pytest.raises(FailedPreconditionError, match="other@1"):
        planner.plan(req)


def test_readers_and_orders_are_shared_by_streams(planner: ReadPlanner) -> None:
    a = planner.plan(request(seed=5, shuffle="block", rank=0, world_size=2))
    b = planner.plan(request(seed=5, shuffle="block", rank=1, world_size=2))
    c = planner.plan(request(seed=6, shuffle="block"))
    assert a.readers[0] is b.readers[0] is c.readers[0]
    assert a.selector is b.selector and a.selector is not c.selector
