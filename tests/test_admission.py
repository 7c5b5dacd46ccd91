"""Admission against real server processes: what one request, one client or many stalled streams may
take of a server (DESIGN §10).

- Random ReadRequests (hypothesis: sizes, offsets, strings, JSON parameters nested deep or holding
  huge numbers) sent over a raw gRPC channel get an answer, never INTERNAL; the server's memory stays
  bounded and a well-formed stream running meanwhile completes with the right rows.
- Streams opened and left unread: the excess gets RESOURCE_EXHAUSTED with a retry hint, counted by
  the limit it hit; the bytes they hold (the buffer gauge) stay within the budget plus one build's
  reservation, even when they are opened in a burst; and the server's RSS stays within the bound
  of admission.py (warm + cache + BOUND_FACTOR x budget; 256 block-shuffled streams and 1,000
  streams behind the `slow` marker: `make soak`).
- A frozen (SIGSTOPped) client's streams are cut by the write timeout and counted once each, or by
  keepalive; either way they release what they held and the server keeps serving.
- A Loader refused by a busy server reads from another.

Each wait is on a condition with a deadline (never a fixed sleep); RSS is read with psutil.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.cli import build_parser, common
from shardstream.cli.serve import config_from_args
from shardstream.client import Loader
from shardstream.errors import RETRY_PUSHBACK_KEY
from shardstream.server.local_fleet import LocalServer
from shardstream.server.read.message_steps import BUILD_PEAK_FACTOR
from shardstream.server.serving.admission import BOUND_FACTOR
from shardstream.server.serving.config import ServerConfig
from shardstream.v1 import shardstream_pb2 as pb

from .support import media
from .support.data import write_dataset
from .support.servers import Servers, rpc_count, scrape, wait_for
from .support.stalls import Streams, server_rss, stalled_process, write_blobs

MiB = 1 << 20


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("admission") / "root"
    write_dataset(root, "toy", 1009, row_group_rows=50, shard_rows=230)
    media.write_table(root, "imgs", media.blob_table("image", media.real_images()[:6]))
    media.write_table(root, "episodes", media.episodes_table(8))
    write_blobs(root, "blobs", 512, 64 << 10)  # 32 MiB of incompressible rows
    return root


@pytest.fixture(scope="module")
def servers(root: Path) -> Iterator[Servers]:
    with Servers(root) as s:
        yield s


def blobs(**fields: Any) -> pb.ReadRequest:
    """Streams of 256 KiB messages (4 rows of 64 KiB a step, 1 step a message), 128 steps long;
    fully shuffled, so that each message is a copy of its rows (unshuffled, a message is a slice of
    its 1 MiB row group and counts as the whole row group against the buffer budget)."""
    return pb.ReadRequest(
        dataset="blobs@1",
        **{"world_size": 1, "batch_size": 4, "max_message_bytes": 256 << 10, "shuffle": pb.Shuffle(mode="full"), **fields},
    )


MESSAGE_RESERVATION = BUILD_PEAK_FACTOR * (256 << 10)  # what a blobs() stream reserves for a build


# --- random requests --------------------------------------------------------------------------------
PROPERTY_CAP = 2 * MiB
U32, U64 = 2**32 - 1, 2**64 - 1


def sizes(high: int) -> st.SearchStrategy[int]:
    """Mostly small and plausible, sometimes the type's edge or anything."""
    return st.one_of(st.integers(0, 40), st.sampled_from([high, high - 1, 2**31]), st.integers(0, high))


def nested_json(depth: int) -> str:
    return '{"column": ' + "[" * depth + "]" * depth + "}"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
KNOWN_PARAMS = ["column", "size", "crop", "mode", "seq_len", "window", "num_frames", "length", "sample_rate",
                "tokenizer", "stride", "normalize", "output", "eos_id", "n_step", "gamma"]
params_json = st.one_of(
    st.dictionaries(st.sampled_from(KNOWN_PARAMS), json_values, max_size=4).map(json.dumps),
    st.builds(nested_json, st.integers(20, 40_000)),
    st.sampled_from(['{"size": ' + "9" * 5000 + "}", '{"size": [8192, 8192]}', "{", "[]", '{"seq_len": 1e999}']),
    st.text(max_size=50),
)
transforms = st.lists(
    st.builds(
        pb.Transform,
        op=st.sampled_from(["image.decode", "audio.decode", "video.frames", "text.tokenize", "text.pack",
                            "rl.windows", "nope", ""]),
        params_json=params_json,
    ),
    max_size=3,
)
PLAUSIBLE_TRANSFORMS = {
    "toy@1": [[], [("text.tokenize", {"tokenizer": "bytes"}), ("text.pack", {"seq_len": 64})]],
    "imgs@1": [[], [("image.decode", {"size": [32, 48], "crop": "random", "hflip": True})]],
    "episodes@1": [[], [("rl.windows", {"window": 8, "n_step": 3})]],
}
WILD: dict[str, st.SearchStrategy[Any]] = {  # per field: values from absurd to malformed
    "dataset": st.one_of(
        st.sampled_from(["nope", "", "toy@0", "toy@99999999999999999999", "t" * 600]), st.text(max_size=40)
    ),
    "fingerprint": st.text(max_size=70),
    "seed": sizes(U64),
    "epoch": sizes(U64),
    "start_offset": sizes(U64),
    "rank": sizes(U32),
    "world_size": sizes(U32),
    "batch_size": sizes(U32),
    "first_step": sizes(U64),
    "num_steps": sizes(U64),
    "max_message_bytes": sizes(U64),
    "mixture_block": sizes(U32),
    "mixture_epoch_samples": sizes(U64),
    "step_stride": sizes(U32),
    "on_error": st.sampled_from(["", "fail", "skip", "bogus"]),
    "columns": st.lists(st.sampled_from(["id", "x", "text", "image", "nope"]) | st.text(max_size=10), max_size=4),
    "shuffle": st.builds(pb.Shuffle, mode=st.sampled_from(["", "none", "block", "full", "bogus"]), window=sizes(U32)),
    "transforms": transforms,
    "mixture": st.lists(
        st.builds(pb.MixtureSource, dataset=st.sampled_from(["toy@1", "toy@2", "imgs@1", "x"]), weight=st.floats()),
        max_size=3,
    ),
}


@st.composite
def requests(draw: st.DrawFn) -> pb.ReadRequest:
    """A plausible request (a dataset, a slice, transforms that fit it), then 0-3 of its fields
    replaced by wild values."""
    dataset = draw(st.sampled_from(sorted(PLAUSIBLE_TRANSFORMS)))
    world = draw(st.integers(1, 4))
    req = pb.ReadRequest(
        dataset=dataset,
        seed=draw(st.integers(0, 2**63 - 1)),
        epoch=draw(st.integers(0, 3)),
        shuffle=pb.Shuffle(mode=draw(st.sampled_from(["none", "block", "full"])), window=draw(st.integers(0, 8))),
        rank=draw(st.integers(0, world - 1)),
        world_size=world,
        batch_size=draw(st.integers(1, 300)),
        first_step=draw(st.integers(0, 3)),
        num_steps=draw(st.integers(0, 6)),
        drop_last=draw(st.booleans()),
        max_message_bytes=draw(st.sampled_from([0, 1, 4096, 1 << 40])),
        step_stride=draw(st.integers(0, 3)),
        on_error=draw(st.sampled_from(["", "skip"])),
        split_steps=draw(st.booleans()),
    )
    for op, params in draw(st.sampled_from(PLAUSIBLE_TRANSFORMS[dataset])):
        req.transforms.add(op=op, params_json=json.dumps(params))
    if dataset == "toy@1" and draw(st.booleans()):  # a mixture instead
        req.dataset = ""
        req.mixture.add(dataset="toy@1", weight=draw(st.floats(0.1, 10)))
        req.mixture.add(dataset="toy@2", weight=draw(st.floats(0.1, 10)))
        req.mixture_block = draw(st.sampled_from([0, 2, 64, 5000]))
        req.mixture_epoch_samples = draw(st.sampled_from([0, 1, 500, 3000]))
    for name in draw(st.lists(st.sampled_from(sorted(WILD)), max_size=3, unique=True)):
        value = draw(WILD[name])
        if name in ("columns", "transforms", "mixture"):
            del getattr(req, name)[:]
            getattr(req, name).extend(value)
        elif name == "shuffle":
            req.shuffle.CopyFrom(value)
        else:
            setattr(req, name, value)
    return req


ANSWERS = {  # what a request may get: never INTERNAL (a server bug) or UNKNOWN
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DATA_LOSS,  # a transform that cannot decode a sample, with on_error="fail"
}


@pytest.fixture(scope="module")
def property_server(servers: Servers) -> LocalServer:
    return servers.start(
        metrics=True,
        extra_args=("--max-batch-size", "4096", "--max-message-mib", "2", "--max-sample-mib", "4", "--cache-mib", "64"),
    )


class GoodStream:
    """A well-formed Loader run over and over in a thread, each checked to deliver every row once."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.runs = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                with Loader([self.target], "toy@1", batch_size=16, seed=self.runs, epochs=1) as ld:
                    ids = sorted(i for batch in ld for i in batch["id"].tolist())
                assert ids == list(range(1009)), "the well-formed stream lost or doubled rows"
                self.runs += 1
        except BaseException as exc:  # noqa: BLE001 — handed to the test thread
            self.error = exc

    def __enter__(self) -> GoodStream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)


def answer(streams: Streams, request: bytes) -> tuple[grpc.StatusCode, int]:
    """(the stream's status, its largest message) for a Read of `request` (raw bytes)."""
    code, _, largest = streams.read_through(request)
    assert code in ANSWERS, code
    return code, largest


def test_random_requests_never_get_internal_and_memory_stays_bounded(property_server: LocalServer) -> None:
    target = property_server.target
    rss_before = server_rss(property_server)
    peak = [rss_before]
    codes: dict[str, int] = {}

    with Streams(target) as channel, GoodStream(target) as good:

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
        @given(requests())
        def check(req: pb.ReadRequest) -> None:
            code, largest = answer(channel, req.SerializeToString())
            codes[code.name] = codes.get(code.name, 0) + 1
            assert largest <= PROPERTY_CAP, f"a message of {largest} bytes, over the server's cap"
            peak.append(server_rss(property_server))

        check()
        # Bytes that are no ReadRequest at all: INVALID_ARGUMENT, not INTERNAL.
        for raw in (b"\x0a\x02\xff\xfe", b"\xff\xff\xff", b"\x0a\x80"):
            assert answer(channel, raw)[0] == grpc.StatusCode.INVALID_ARGUMENT
        wait_for(lambda: good.runs >= 1 or good.error is not None, "the well-formed stream to complete once")
    if good.error is not None:
        raise good.error
    grown = (max(peak) - rss_before) / MiB
    print(f"\nanswers {codes}; server RSS {rss_before / MiB:.0f} MiB, peak +{grown:.0f} MiB")
    assert codes.get("OK", 0) and codes.get("INVALID_ARGUMENT", 0)
    assert grown < 512, f"server RSS grew by {grown:.0f} MiB"
    metrics = scrape(property_server)
    assert rpc_count(metrics, "Read", "Internal") == 0


# --- stalled streams --------------------------------------------------------------------------------
def stalled_rss_budget(server: LocalServer, cache_mib: int, buffer_mib: int) -> int:
    """What the server may hold with streams stalled (admission.py, deploy/RUNBOOK.md "Limits"): its
    RSS once warm (one stream read through: thread pools started, row-group cache filled), its
    cache again and BOUND_FACTOR times its stream buffer budget."""
    with Streams(server.target) as warm:
        code, messages, _ = warm.read_through(blobs().SerializeToString(), 60)
        assert code == grpc.StatusCode.OK and messages > 1
    wait_for(lambda: scrape(server)["shardstream_streams_active"] == 0, "the warm-up stream to end")
    return server_rss(server) + (cache_mib + BOUND_FACTOR * buffer_mib) * MiB


def test_stalled_streams_beyond_the_limit_are_refused_and_memory_stays_in_budget(servers: Servers) -> None:
    limits = ("--max-streams", "100", "--max-streams-per-peer", "100", "--stream-buffer-mib", "96")
    server = servers.start(metrics=True, extra_args=(*limits, "--cache-mib", "16"))
    budget = stalled_rss_budget(server, 16, 96)
    with Streams(server.target, connections=4) as streams:
        codes = streams.open(blobs(), 200)
        refused = [c for c in codes if c != grpc.StatusCode.OK]
        assert codes.count(grpc.StatusCode.OK) == 100
        assert set(refused) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        metrics = scrape(server)
        assert metrics["shardstream_streams_active"] == 100
        assert metrics['shardstream_streams_refused_total{limit="server"}'] == 100
        assert rpc_count(metrics, "Read", "ResourceExhausted") == 100
        assert metrics["shardstream_stream_buffer_bytes"] <= 96 * MiB
        rss = server_rss(server)
        print(f"\n100 stalled streams (+100 refused): server RSS {rss / MiB:.0f} MiB, budget {budget / MiB:.0f} MiB")
        assert rss < budget
        # The refusal says why and when to come back.
        err = streams.refusal(blobs())
        assert "server busy: 100 Read streams in progress" in err.details()
        assert (RETRY_PUSHBACK_KEY, "1000") in tuple(err.trailing_metadata())
    wait_for(lambda: scrape(server)["shardstream_streams_active"] == 0, "the cancelled streams to end")
    assert scrape(server)["shardstream_stream_buffer_bytes"] == 0


def test_the_peer_and_buffer_limits(servers: Servers) -> None:
    server = servers.start(metrics=True, extra_args=("--max-streams-per-peer", "10", "--stream-buffer-mib", "2"))
    with Streams(server.target, connections=2) as streams:
        codes = streams.open(blobs(), 15)
    assert codes.count(grpc.StatusCode.OK) <= 10
    metrics = scrape(server)
    assert metrics['shardstream_streams_refused_total{limit="peer"}'] + metrics[
        'shardstream_streams_refused_total{limit="buffer"}'
    ] == codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    # 2 MiB: 4-8 such streams (each holds the 256 KiB message Flight writes, and one built ahead if room)
    assert metrics['shardstream_streams_refused_total{limit="buffer"}'] >= 1
    wait_for(lambda: scrape(server)["shardstream_streams_active"] == 0, "the cancelled streams to end")
    with Streams(server.target) as streams:
        assert streams.open(blobs(), 10).count(grpc.StatusCode.OK) >= 4  # the slots came back


def test_the_buffer_budget_holds_while_a_burst_of_streams_stalls(servers: Servers) -> None:
    """The budget counts what streams hold continuously, not only at admission: a burst of streams
    admitted together holds at most the budget plus one build's reservation; the rest are refused
    for the buffer with a retry hint, and the slots come back once the streams end."""
    budget = 8 * MiB
    limits = ("--max-streams", "200", "--max-streams-per-peer", "200", "--stream-buffer-mib", "8")
    server = servers.start(metrics=True, extra_args=(*limits, "--cache-mib", "16"))
    clients = [Streams(server.target, connections=2) for _ in range(4)]
    try:
        opened = [threading.Thread(target=c.open, args=(blobs(seed=i),), kwargs={"n": 25}) for i, c in enumerate(clients)]
        for t in opened:
            t.start()
        for t in opened:
            t.join()
        codes = [code for c in clients for code in c.codes]
        admitted = codes.count(grpc.StatusCode.OK)
        metrics = scrape(server)
        held = metrics["shardstream_stream_buffer_bytes"]
        print(f"\n100 streams in a burst: {admitted} admitted and stalled, holding {held / MiB:.1f} MiB")
        assert 0 < admitted < 100 and codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 100 - admitted
        assert metrics['shardstream_streams_refused_total{limit="buffer"}'] == 100 - admitted
        assert 0 < held <= budget + MESSAGE_RESERVATION
        assert metrics["shardstream_streams_active"] == admitted
        err = clients[0].refusal(blobs())
        assert "--stream-buffer-mib" in err.details()
        assert (RETRY_PUSHBACK_KEY, "1000") in tuple(err.trailing_metadata())
        assert scrape(server)["shardstream_stream_buffer_bytes"] <= budget + MESSAGE_RESERVATION
    finally:
        for c in clients:
            c.close()
    wait_for(lambda: scrape(server)["shardstream_streams_active"] == 0, "the cancelled streams to end")
    assert scrape(server)["shardstream_stream_buffer_bytes"] == 0
    with Streams(server.target) as streams:  # the budget came back: a whole stream reads through
        code, messages, _ = streams.read_through(blobs().SerializeToString())
        assert code == grpc.StatusCode.OK and messages == 128


def test_streams_beyond_the_budget_wait_for_it_and_all_finish(servers: Servers) -> None:
    """Readers that together want more than the budget: they take turns (a stream without room
    waits, holding nothing) and every one delivers its whole stream."""
    server = servers.start(metrics=True, extra_args=("--stream-buffer-mib", "1", "--cache-mib", "16"))
    results: list[tuple[grpc.StatusCode, int, int]] = []

    def read(i: int) -> None:
        with Streams(server.target) as s:
            results.append(s.read_through(blobs(seed=i).SerializeToString()))

    readers = [threading.Thread(target=read, args=(i,)) for i in range(6)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    ok = [r for r in results if r[0] == grpc.StatusCode.OK]
    assert ok, results  # a stream that holds nothing may always build: someone progresses
    assert all(r[0] in (grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED) for r in results), results
    assert all(messages == 128 for _, messages, _ in ok)
    assert scrape(server)["shardstream_stream_buffer_bytes"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "block", "full"])
def test_stalled_streams_stay_within_the_memory_bound(servers: Servers, mode: str) -> None:
    """256 streams from one peer (its cap), 1 MiB messages, left unread: peak RSS within the bound."""
    limits = ("--max-streams", "256", "--max-streams-per-peer", "256", "--stream-buffer-mib", "32")
    server = servers.start(metrics=True, extra_args=(*limits, "--cache-mib", "16"))
    bound = stalled_rss_budget(server, 16, 32)
    request = blobs(shuffle=pb.Shuffle(mode=mode), batch_size=16, max_message_bytes=1 << 20)
    peak = 0
    with Streams(server.target, connections=2) as streams:
        for _ in range(8):  # 32 at a time, the RSS read after each round
            streams.open(request, 32)
            peak = max(peak, server_rss(server))
        admitted = streams.codes.count(grpc.StatusCode.OK)
        print(f"\n256 streams, shuffle {mode}: {admitted} admitted, peak RSS {peak / MiB:.0f} MiB, bound {bound / MiB:.0f}")
        assert admitted > 0 and streams.codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 256 - admitted
        assert peak < bound


@pytest.mark.slow
def test_a_thousand_stalled_streams(servers: Servers) -> None:
    limits = ("--max-streams", "800", "--max-streams-per-peer", "1000", "--stream-buffer-mib", "512")
    server = servers.start(metrics=True, extra_args=(*limits, "--cache-mib", "16"))
    budget = stalled_rss_budget(server, 16, 512)
    with Streams(server.target, connections=8) as streams:
        codes = streams.open(blobs(), 1000)
        ok = codes.count(grpc.StatusCode.OK)
        rss = server_rss(server)
        print(f"\n1000 streams: {ok} admitted and stalled, server RSS {rss / MiB:.0f} MiB, budget {budget / MiB:.0f}")
        assert 0 < ok <= 800 and codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 1000 - ok
        assert rss < budget


# --- frozen clients -----------------------------------------------------------------------------------
def test_a_frozen_clients_streams_are_cut(servers: Servers, tmp_path: Path) -> None:
    """The write timeout (the data plane's only way: its Flight server sends no keepalive pings)."""
    server = servers.start(metrics=True, extra_args=("--write-timeout", "1", "--keepalive-time", "600"))
    client = stalled_process(server.target, blobs(), 20, tmp_path)
    try:
        assert (tmp_path / "stalled.ready").read_text().split() == ["OK"] * 20
        metrics = scrape(server)
        assert metrics["shardstream_streams_active"] == 20 and metrics["shardstream_stream_buffer_bytes"] > 0
        os.kill(client.pid, signal.SIGSTOP)
        wait_for(lambda: scrape(server)["shardstream_streams_active"] == 0, "the frozen client's streams to end")
        metrics = scrape(server)
        assert metrics["shardstream_stream_buffer_bytes"] == 0
        assert metrics["shardstream_streams_reaped_total"] == 20  # every stream of the connection
        with Streams(server.target) as streams:  # and the server serves on
            assert streams.open(blobs(num_steps=2), 1) == [grpc.StatusCode.OK]
    finally:
        os.killpg(client.pid, signal.SIGKILL)
        client.wait()


def test_each_reaped_stream_is_counted_once(servers: Servers, tmp_path: Path) -> None:
    """Stalled streams over several connections, frozen: every stream is reaped and counted once,
    whether the sweeper found it overdue or its connection was shut down under it."""
    server = servers.start(metrics=True, extra_args=("--write-timeout", "1", "--keepalive-time", "600"))
    clients = []
    try:
        for name in ("a", "b", "c"):
            (tmp_path / name).mkdir()
            clients.append(stalled_process(server.target, blobs(), 30, tmp_path / name))
            assert (tmp_path / name / "stalled.ready").read_text().split() == ["OK"] * 30
        for client in clients:  # (the first ones may be reaped already: they read nothing either)
            os.kill(client.pid, signal.SIGSTOP)
        wait_for(lambda: scrape(server)["shardstream_streams_active"] == 0, "the frozen clients' streams to end")
        metrics = scrape(server)
        assert metrics["shardstream_streams_reaped_total"] == 90
        assert metrics["shardstream_stream_buffer_bytes"] == 0
    finally:
        for client in clients:
            os.killpg(client.pid, signal.SIGKILL)
            client.wait()


# --- the Loader and a busy server ---------------------------------------------------------------------
def test_a_loader_refused_by_a_busy_server_reads_from_another(servers: Servers) -> None:
    busy = servers.start(metrics=True, extra_args=("--max-streams", "1"))
    free = servers.start()
    with Streams(busy.target) as hog:
        assert hog.open(blobs(), 1) == [grpc.StatusCode.OK]
        with Loader([busy.target, free.target], "toy@1", batch_size=100, shuffle=False) as ld:
            ids = [i for batch in ld for i in batch["id"].tolist()]
    assert ids == list(range(1009))
    assert scrape(busy)['shardstream_streams_refused_total{limit="server"}'] >= 1


def test_serve_flags_default_to_the_server_config_defaults(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--root", str(tmp_path), "--workers", "1", "--transform-threads", "1"])
    common.apply_global_options(parser, args)
    cfg, defaults = config_from_args(args), ServerConfig(root=str(tmp_path), port=7070)
    for name in (
        "max_batch_size",
        "max_message_bytes",
        "max_sample_bytes",
        "max_streams",
        "max_streams_per_peer",
        "stream_buffer_bytes",
        "write_timeout_s",
        "keepalive_time_s",
        "keepalive_timeout_s",
        "max_connection_idle_s",
    ):
        assert getattr(cfg, name) == getattr(defaults, name), name
    shares = ServerConfig(root="r", port=0, max_streams=10, stream_buffer_bytes=100).worker_shares(4)
    assert (shares["max_streams"], shares["stream_buffer_bytes"]) == (3, 25)
