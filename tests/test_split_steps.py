"""Steps larger than the server's cap on bytes per message travel in parts and arrive whole.

Built without a server (MessageBuilder with a small cap): every message fits the cap, a step's
parts are numbered in order, and put back together (client/parts.py) they are exactly the step an
uncapped server sends — raw rows and per-sample transforms split by samples, text.pack cut by rows,
several whole steps cut at step boundaries. Over a real server and Loader: the rows arrive intact,
a Loader resumed from any state delivers exactly the rest, and a stream cut in the middle of a step
resumes at that step (on the next endpoint) with every sample exactly once.
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
import pyarrow.parquet as pq
import pytest

from shardstream.client import Loader
from shardstream.client.parts import StepParts
from shardstream.client.spec import RetryPolicy
from shardstream.client.transport.session import CallRegistry, StreamSession
from shardstream.errors import RETRY_PUSHBACK_KEY, DataLossError, InvalidArgumentError, from_grpc_error
from shardstream.provenance import expand, one_run, runs_of
from shardstream.server.backends.roots import open_registry
from shardstream.server.read.build import MessageBuilder
from shardstream.server.read.message_steps import Message
from shardstream.server.read.plan import ReadPlanner
from shardstream.server.read.reader import new_row_group_cache
from shardstream.server.read.request_limits import RequestLimits
from shardstream.v1 import shardstream_pb2 as pb

from .support import media
from .support.data import write_dataset
from .support.resume import as_json, check_resume, plain
from .support.servers import Servers, data_port_behind, scrape, unused_port
from .support.stalls import write_blobs
from .support.tcp_cut import CutOnce

CAP = 64 << 10
BAD_IMAGES = {1, 6}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("split") / "root"
    write_blobs(root, "blobs", 96, 8 << 10)
    write_dataset(root, "toy", 300, row_group_rows=20, shard_rows=70)
    # Rows that grow: small first (many steps a message), then 16 KiB each (a message over the cap).
    rng = np.random.default_rng(1)
    sizes = [64] * 120 + [16 << 10] * 40
    media.write_table(
        root,
        "growing",
        pa.table({"id": np.arange(len(sizes)), "blob": pa.array([rng.bytes(n) for n in sizes], pa.binary())}),
    )
    items = [
        (f"bad-{i}", b"not an image") if i in BAD_IMAGES else (f"ok-{i}", media.random_png(i, 20, 20))
        for i in range(12)
    ]
    media.write_table(root, "imgs", media.blob_table("image", items), row_group_rows=4, shard_rows=8)
    return root


def planner(root: Path, cap: int) -> Iterator[ReadPlanner]:
    with open_registry(str(root)) as registry:
        yield ReadPlanner(registry, new_row_group_cache(16 << 20), RequestLimits(max_message_bytes=cap))


def request(dataset: str, transforms: list[dict[str, Any]] = (), **fields: Any) -> pb.ReadRequest:  # type: ignore[assignment]
    req = pb.ReadRequest(dataset=dataset, **{"world_size": 1, "batch_size": 8, "split_steps": True, **fields})
    for t in transforms:
        req.transforms.add(op=t["op"], params_json=json.dumps({k: v for k, v in t.items() if k != "op"}))
    return req


def steps_of(messages: list[Message]) -> list[tuple[pb.StepInfo, pa.RecordBatch]]:
    """(StepInfo, rows) per step, parts put back together as the client does."""
    parts = StepParts()
    out = []
    for data in messages:
        whole = parts.add(data.header, data.batch)
        if whole is None:
            continue
        header, payload = whole
        batch = payload
        row = 0
        for st in header.steps:
            out.append((st, batch.slice(row, st.rows)))
            row += st.rows
    return out


def key(st: pb.StepInfo) -> tuple[Any, ...]:
    """A step's positions, rows and skipped samples (their reasons name objects by address)."""
    skipped = [(k.position, k.shard, k.row, k.source, k.reason.split(":")[0]) for k in st.skipped]
    return (st.step, st.position_start, st.position_end, st.global_start, st.global_end, st.rows, skipped)


SPLITS = [
    ("blobs", [], {"batch_size": 40}),  # 320 KiB steps: parts of samples
    ("blobs", [], {"batch_size": 40, "world_size": 2, "rank": 1, "shuffle": pb.Shuffle(mode="full")}),
    ("growing", [], {"batch_size": 6}),  # whole steps cut at step boundaries, then parts
    ("imgs", [{"op": "image.decode", "size": [64, 64]}], {"batch_size": 6, "on_error": "skip"}),
    ("toy", [{"op": "text.tokenize", "tokenizer": "bytes"}, {"op": "text.pack", "seq_len": 1024}], {"batch_size": 300}),
]


@pytest.mark.parametrize(("dataset", "transforms", "fields"), SPLITS)
def test_steps_over_the_cap_come_in_parts_that_make_the_uncapped_steps(
    root: Path, dataset: str, transforms: list[dict[str, Any]], fields: dict[str, Any]
) -> None:
    req = request(dataset, transforms, **fields)
    for p in planner(root, 1 << 30):
        whole = list(MessageBuilder().messages(p.plan(req)))
    for p in planner(root, CAP):
        split = list(MessageBuilder().messages(p.plan(req)))
    assert all(d.nbytes <= CAP for d in split), max(d.nbytes for d in split)
    headers = [d.header for d in split]
    parts = [h.steps[0] for h in headers if any(st.part or st.more_parts for st in h.steps)]
    assert parts, "no step was split: make the steps larger"
    assert all(len(h.steps) == 1 for h in headers if h.steps[0].more_parts or h.steps[0].part)
    assert [h.end_of_epoch for h in headers] == [False] * (len(headers) - 1) + [True]
    expected, got = steps_of(whole), steps_of(split)
    assert [key(st) for st, _ in got] == [key(st) for st, _ in expected]
    for (_, a), (_, b) in zip(got, expected, strict=True):
        assert a.equals(b)


def test_parts_are_numbered_in_order_and_only_the_last_completes_the_step(root: Path) -> None:
    for p in planner(root, CAP):
        messages = list(MessageBuilder().messages(p.plan(request("blobs", batch_size=40))))
    seen: dict[int, list[tuple[int, bool]]] = {}
    for data in messages:
        (st,) = data.header.steps
        seen.setdefault(st.step, []).append((st.part, st.more_parts))
    for step, parts in seen.items():
        n = len(parts)
        assert n > 1, step
        assert parts == [(k, k < n - 1) for k in range(n)], step


def test_a_client_without_split_steps_gets_whole_steps_or_a_clear_refusal(root: Path) -> None:
    for p in planner(root, CAP):
        small = list(MessageBuilder().messages(p.plan(request("blobs", batch_size=4, split_steps=False))))
        assert all(not st.part and not st.more_parts for d in small for st in d.header.steps)
        with pytest.raises(InvalidArgumentError, match=r"step 0 is \d+ bytes, over this server's cap of 65536"):
            list(MessageBuilder().messages(p.plan(request("blobs", batch_size=40, split_steps=False))))


# --- the client's side ----------------------------------------------------------------------------
def part(step: int, k: int, more: bool, rows: list[int], epoch: int = 0) -> tuple[pb.ReadHeader, pa.Buffer]:
    header = pb.ReadHeader(epoch=epoch, steps=[pb.StepInfo(step=step, rows=len(rows), part=k, more_parts=more)])
    return header, pa.record_batch({"id": pa.array(rows, pa.int64())})


def test_step_parts_refuse_what_does_not_make_a_step() -> None:
    parts = StepParts()
    with pytest.raises(DataLossError, match="began with part 1"):
        parts.add(*part(0, 1, True, [1]))
    parts.add(*part(0, 0, True, [1]))
    with pytest.raises(DataLossError, match="expected part 1 of step 0, the server sent part 0 of step 1"):
        parts.add(*part(1, 0, True, [2]))
    parts.reset()
    parts.add(*part(0, 0, True, [1]))
    with pytest.raises(DataLossError, match="step 0 ended after part 0"):
        parts.add(pb.ReadHeader(steps=[pb.StepInfo(step=1, rows=0)]), pa.record_batch({"id": pa.array([], pa.int64())}))


def test_step_parts_join_their_provenance() -> None:
    """Parts whose headers name their rows' provenance (ReadRequest.provenance_in_header) come back
    as one step whose header names all of them, in order, whichever form each part's runs take; a
    step whose parts do not all name theirs is DATA_LOSS."""
    parts = StepParts()
    pieces = [(one_run(1, 100, 3), [0, 1, 2]), (runs_of(np.array([1, 2], np.int32), np.array([7, 3])), [3, 4]), (one_run(2, 4, 4), [5, 6, 7, 8])]
    out = None
    for k, (prov, rows) in enumerate(pieces):
        header, batch = part(0, k, k < len(pieces) - 1, rows)
        header.provenance.CopyFrom(prov)
        out = parts.add(header, batch)
    assert out is not None
    header, batch = out
    shards, rows = expand(header.provenance, batch.num_rows)
    assert shards.tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 2] and rows.tolist() == [100, 101, 102, 7, 3, 4, 5, 6, 7]
    header, batch = part(0, 0, True, [0])
    header.provenance.CopyFrom(one_run(0, 0, 1))
    parts.add(header, batch)
    with pytest.raises(DataLossError, match="1 of its 2 parts name their rows' provenance"):
        parts.add(*part(0, 1, False, [1]))


class _Error(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self._code, self._metadata = code, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._code.name

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


class _Call:
    stream_id = ""

    def __init__(self, messages: list[tuple[pb.ReadHeader, pa.Buffer]], then: _Error | None = None) -> None:
        self.messages, self.then = messages, then

    def __iter__(self) -> Iterator[tuple[pb.ReadHeader, pa.Buffer]]:
        yield from self.messages
        if self.then is not None:
            raise from_grpc_error(self.then)  # the project's error, as a ReadCall raises it

    def cancel(self) -> bool:
        return True


class _Waits(threading.Event):
    """A stop event that records the backoffs asked of it and never sleeps."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


def scripted(calls: list[_Call]) -> tuple[StreamSession, list[int], _Waits]:
    opened: list[int] = []
    script = iter(calls)

    def open_call(endpoint: str, req: pb.ReadRequest) -> _Call:
        opened.append(req.first_step)
        return next(script)

    registry = CallRegistry(open_call)
    registry.stopped = waits = _Waits()
    session = StreamSession(
        registry,
        lambda step: pb.ReadRequest(first_step=step),
        endpoints=("a:1",),
        endpoint=0,
        first_step=0,
        step_stride=1,
        retry=RetryPolicy(max_retries=5, backoff_base_s=0.0, backoff_max_s=2.0, budget_s=0.0),
        what="blobs@1 epoch 0",
    )
    return session, opened, waits


def test_a_stream_broken_mid_step_resumes_at_that_step_and_hands_it_over_once() -> None:
    unavailable = _Error(grpc.StatusCode.UNAVAILABLE)
    session, opened, _ = scripted(
        [
            _Call([part(0, 0, True, [0, 1]), part(0, 1, False, [2]), part(1, 0, True, [3])], then=unavailable),
            _Call([part(1, 0, True, [3]), part(1, 1, True, [4]), part(1, 2, False, [5])]),
        ]
    )
    got = []
    for _ in range(2):
        message = session.next_message()
        assert message is not None
        header, payload = message
        (st,) = header.steps
        got.append((st.step, st.rows, st.part, st.more_parts, payload.column("id").to_pylist()))
    assert got == [(0, 3, 0, False, [0, 1, 2]), (1, 3, 0, False, [3, 4, 5])]
    assert opened == [0, 1]  # reopened at step 1, the step it was in the middle of
    assert session.next_step == 2


def test_a_busy_servers_retry_hint_lengthens_the_backoff() -> None:
    busy = _Error(grpc.StatusCode.RESOURCE_EXHAUSTED, ((RETRY_PUSHBACK_KEY, "1500"),))
    session, opened, waits = scripted([_Call([], then=busy), _Call([part(0, 0, False, [0])])])
    assert session.next_message() is not None
    assert opened == [0, 0]
    assert len(waits.waits) == 1 and 1.0 < waits.waits[0] <= 1.5  # the hint, not the 0 s backoff


# --- a real server and Loader ---------------------------------------------------------------------
ROWS, ROW_BYTES, BATCH = 96, 48 << 10, 32  # 1.5 MiB steps against a 1 MiB cap: 2 parts each


@pytest.fixture(scope="module")
def big_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("split-e2e") / "root"
    write_blobs(root, "blobs", ROWS, ROW_BYTES)
    return root


@pytest.fixture(scope="module")
def servers(big_root: Path) -> Iterator[Servers]:
    with Servers(big_root) as s:
        s.start(metrics=True, extra_args=("--max-message-mib", "1"))
        s.start(metrics=True, extra_args=("--max-message-mib", "1"))
        yield s


def source(root: Path) -> pa.Table:
    files = sorted((root / "blobs").rglob("*.parquet"))
    return pa.concat_tables([pq.read_table(f, columns=["id", "blob"]) for f in files]).sort_by("id")


def test_a_step_over_the_cap_arrives_intact(servers: Servers, big_root: Path) -> None:
    server = servers.started[0]
    before = scrape(server).get("shardstream_step_parts_sent_total", 0)
    with Loader([server.target], "blobs@1", batch_size=BATCH, output="arrow", max_message_bytes=8 << 20) as ld:
        batches = list(ld)
    assert scrape(server)["shardstream_step_parts_sent_total"] - before >= 2 * len(batches)
    got = pa.Table.from_batches(batches).select(["id", "blob"])
    assert [b.num_rows for b in batches] == [BATCH] * (ROWS // BATCH)
    assert got.sort_by("id").equals(source(big_root))  # every row once, every byte as stored


def test_a_loader_with_split_steps_resumes_exactly(servers: Servers) -> None:
    endpoints = [s.target for s in servers.started]
    check_resume(
        lambda: Loader(endpoints, "blobs@1", batch_size=BATCH, seed=3, shuffle=True, epochs=2),
        cuts=[1, 4],
        epochs=2,
        item=plain,
        checkpoint=as_json,
    )


def test_a_stream_cut_mid_step_resumes_at_that_step_every_sample_once(servers: Servers) -> None:
    _, b = servers.started
    rows_sent = scrape(b)["shardstream_rows_sent_total"]
    data_port = unused_port()
    with CutOnce(data_port, cut_after_bytes=(ROW_BYTES * BATCH) * 3 // 4) as proxy:  # in step 0's second part
        # a: its data plane behind the proxy, which GetDataset names as its data port
        a = servers.start(extra_args=("--max-message-mib", "1", *data_port_behind(proxy, data_port)))
        with Loader([a.target, b.target], "blobs@1", batch_size=BATCH, prefetch=1, shuffle=False) as ld:
            ids = [i for batch in ld for i in batch["id"].tolist()]
        assert proxy.cut.is_set()
    assert ids == list(range(ROWS))
    assert scrape(b)["shardstream_rows_sent_total"] - rows_sent == ROWS  # b resumed at step 0, from part 0
