"""Streams spread over a supervisor's workers (server/serving/rebalance.py, placement.py): the pure rules
as properties, the placement file between a writer and a worker's reader, and the client following a
stream its worker hands back. The end-to-end run on real processes is tests/test_autoscale_workers.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge

from shardstream.client import Loader, metrics, prefetch
from shardstream.client.prefetch import AHEAD_STEPS
from shardstream.client.transport.fleet import Fleet
from shardstream.client.transport.flight_call import FlightCall
from shardstream.errors import to_flight_error
from shardstream.server.serving.config import ServerConfig
from shardstream.server.serving.placement import (
    PLACEMENT_FILE,
    READ_INTERVAL_S,
    SHED_WINDOW,
    Placement,
    PlacementWriter,
    RankTally,
    SlotOf,
    rank_key,
    streams_by_pid,
)
from shardstream.server.serving.rebalance import MIN_SPREAD, pick_slot, plan_shed
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import N_ROWS, write_dataset
from .support.servers import wait_for

loads = st.dictionaries(st.integers(0, 7), st.integers(0, 200), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(loads)
def test_a_shed_round_only_moves_streams_when_the_spread_is_wide_and_never_below_the_fair_share(streams: dict[int, int]) -> None:
    shed = plan_shed(streams)
    spread = max(streams.values()) - min(streams.values())
    if spread < MIN_SPREAD:
        assert shed == {}
        return
    fair = -(-sum(streams.values()) // len(streams))
    assert all(streams[s] - k == fair and k > 0 for s, k in shed.items())  # down to the fair share
    assert set(shed) == {s for s, n in streams.items() if n > fair}  # every worker above it, none else
    room = sum(max(0, fair - n) for n in streams.values())
    assert sum(shed.values()) <= room  # the others can take every stream handed back


@settings(max_examples=300, deadline=None)
@given(loads, st.lists(st.integers(0, 7), min_size=1, max_size=400))
def test_streams_handed_back_land_on_the_least_busy_workers_and_even_them_out(streams: dict[int, int], askers: list[int]) -> None:
    """One round: every stream handed back asks GetDataset of some worker (any: `askers`, the worker
    its control connection reaches) before the next count; each worker keeps only its own tally of
    what it sent where. When one worker answered every ask, one round reaches a placement that asks
    for no further round (no worker above the fair share): a steady load never moves again."""
    shed = plan_shed(streams)
    after = Counter({s: n - shed.get(s, 0) for s, n in streams.items()})
    tallies: dict[int, Counter[int]] = {}
    moving = sum(shed.values())
    for i in range(moving):
        asker = askers[i % len(askers)]
        # a worker's own view: the published count, less what was handed back, plus its own tally
        given = tallies.setdefault(asker, Counter())
        slot = pick_slot(streams, asker, shed, given)
        given[slot] += 1
        after[slot] += 1
    assert sum(after.values()) == sum(streams.values())  # none lost, none doubled
    if len(tallies) <= 1:  # one worker answered every ask: its tally is the whole truth
        assert plan_shed(after) == {}, after
        assert max(after.values()) <= max(streams.values())


def test_an_idle_server_names_the_answering_workers_own_port() -> None:
    assert pick_slot({0: 0, 1: 0, 2: 0}, 1, {}, {}) == 1
    assert pick_slot({}, 3, {}, {}) == 3  # nothing counted yet
    assert pick_slot({0: 5, 1: 2}, 0, {}, {}) == 1  # a less busy one
    assert pick_slot({0: 5, 1: 2}, 0, {}, {1: 3}) == 0  # ... until this worker sent it as many


def _write(path: Path, generation: int, workers: list[tuple[int, int, int, int]], round_: int = 0) -> None:
    """A placement file; `round_`: the last shed round, whose shares are the workers' shed (as in the
    generation that round was made in) or, without one in this generation, none left to ask."""
    body = {
        "generation": generation,
        "workers": [{"slot": s, "data_port": p, "streams": n, "shed": k} for s, p, n, k in workers],
        "round": round_,
        "round_shed": [[s, k] for s, _, _, k in workers if k],
    }
    path.write_text(json.dumps(body))


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_worker_reads_the_placement_names_ports_and_hands_back_its_share_once_per_round(tmp_path: Path) -> None:
    path, clock = tmp_path / "placement.json", _Clock()
    p = Placement(str(path), 0, 7000, clock)
    assert p.data_port() == 7000 and not p.shed_one()  # no file yet: as a single worker
    _write(path, 1, [(0, 7000, 6, 2), (1, 7001, 0, 0)], round_=1)
    clock.t += READ_INTERVAL_S
    assert [p.data_port() for _ in range(5)] == [7001] * 4 + [7000]  # 6 - 2 handed back: 4 and 0 -> 4 and 4, a tie: its own
    assert [p.shed_one() for _ in range(3)] == [True, True, False]  # its share, once
    clock.t += READ_INTERVAL_S
    assert not p.shed_one()  # the same generation read again: nothing more
    _write(path, 2, [(0, 7000, 4, 0), (1, 7001, 4, 0)], round_=1)  # the same round: its share went
    clock.t += READ_INTERVAL_S
    assert not p.shed_one() and p.data_port() == 7000
    # a round's share stands until the next round, through counts without one (its streams reach
    # a step boundary as their clients read: a worker may not read the round's own generation),
    # and a new round replaces what is left of it
    _write(path, 4, [(0, 7000, 5, 0), (1, 7001, 1, 0)], round_=2)
    body = json.loads(path.read_text())
    body["round_shed"] = [[0, 2]]  # round 2 asked slot 0 for 2, in generation 3 this worker never read
    path.write_text(json.dumps(body))
    clock.t += READ_INTERVAL_S
    assert p.shed_one() and p.shed_one() and not p.shed_one()
    body.update(generation=5, round=3, round_shed=[[0, 1]])
    path.write_text(json.dumps(body))
    clock.t += READ_INTERVAL_S
    p.data_port()  # reads it: a share of 1
    _write(path, 6, [(0, 7000, 0, 0), (1, 7001, 6, 3)], round_=4)  # another round, before this worker's share went
    clock.t += READ_INTERVAL_S
    assert not p.shed_one()
    path.write_text("{torn")  # a torn or foreign file keeps what was read
    clock.t += READ_INTERVAL_S
    assert p.data_port() in (7000, 7001)


def _worker_with_streams(metrics: Path, n: int, moving: int = 0, ranks: int | None = None) -> int:
    """A process that counts `n` Read streams of `ranks` ranks (default: one each) in the
    multiprocess files, `moving` of them asked to move, as a worker does; its pid."""
    code = (
        "import os; from shardstream.server.serving.stream_runtime import STREAMS_ACTIVE; "
        "from shardstream.server.serving.placement import RANKS_ACTIVE, STREAMS_MOVING; "
        f"STREAMS_ACTIVE.labels('d').inc({n}); STREAMS_MOVING.inc({moving}); "
        f"RANKS_ACTIVE.inc({n if ranks is None else ranks}); print(os.getpid())"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
    return int(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout)


def _writer_of_two(tmp_path: Path, first: dict[str, int], second: dict[str, int]) -> tuple[_Clock, Path, PlacementWriter, list[SlotOf]]:
    """A supervisor's writer over two workers (slots 0 and 1) counting what `_worker_with_streams(**first)`
    and `(**second)` count; its clock, the metrics folder, the writer and the workers."""
    clock = _Clock()
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    pids = [_worker_with_streams(metrics, **first), _worker_with_streams(metrics, **second)]
    w = PlacementWriter(tmp_path / "placement.json", metrics, CollectorRegistry(), clock)
    return clock, metrics, w, [SlotOf(0, pids[0], 7000), SlotOf(1, pids[1], 7001)]


def test_the_supervisors_writer_counts_each_worker_and_sheds_on_settled_means(tmp_path: Path) -> None:
    clock = _Clock()
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    pids = [_worker_with_streams(metrics, 6), _worker_with_streams(metrics, 0)]
    assert streams_by_pid(metrics) == {pids[0]: 6, pids[1]: 0}
    registry = CollectorRegistry()
    w = PlacementWriter(tmp_path / "placement.json", metrics, registry, clock)
    workers = [SlotOf(0, pids[0], 7000), SlotOf(1, pids[1], 7001)]

    def sheds(settled: bool = True, on: list[SlotOf] = workers) -> list[int]:
        clock.t += 1.0
        assert w.due()
        placement = w.publish(on, settled=settled)
        assert json.loads((tmp_path / "placement.json").read_text()) == placement
        return [x["shed"] for x in placement["workers"]]

    assert [sheds() for _ in range(SHED_WINDOW - 1)] == [[0, 0]] * (SHED_WINDOW - 1)  # counting
    assert sheds(settled=False) == [0, 0]  # a worker starts or drains: the window starts again
    assert [sheds() for _ in range(SHED_WINDOW - 1)] == [[0, 0]] * (SHED_WINDOW - 1)
    assert sheds() == [3, 0]  # SHED_WINDOW settled counts of 6 and 0
    assert [sheds() for _ in range(SHED_WINDOW - 1)] == [[0, 0]] * (SHED_WINDOW - 1)  # a fresh window
    body = json.loads((tmp_path / "placement.json").read_text())
    assert body["round"] == 1 and body["round_shed"] == [[0, 3]]  # the last round, in every generation
    assert sheds(on=workers[:1]) == [0]  # another set of workers: counted anew
    assert registry.get_sample_value("shardstream_rebalance_rounds_total") == 1
    assert registry.get_sample_value("shardstream_worker_streams", {"worker": "0"}) == 6
    assert registry.get_sample_value("shardstream_worker_ranks", {"worker": "0"}) == 6
    assert registry.get_sample_value("shardstream_worker_streams", {"worker": "1"}) is None  # gone: its series too
    assert registry.get_sample_value("shardstream_worker_ranks", {"worker": "1"}) is None
    assert not w.due()


def test_rounds_even_out_ranks_not_streams(tmp_path: Path) -> None:
    """A rank holds two streams while its next epoch's opens beside its current one's last messages:
    6 streams of 3 ranks against 3 streams of 3 ranks is even (a count of streams said 3 apart and
    moved streams back and forth with the epoch boundaries), 6 ranks against 2 is not."""
    clock, metrics, w, workers = _writer_of_two(tmp_path, {"n": 6, "ranks": 3}, {"n": 3})
    for _ in range(3 * SHED_WINDOW):
        clock.t += 1.0
        placement = w.publish(workers, settled=True)
        assert [x["shed"] for x in placement["workers"]] == [0, 0]
    assert [(x["ranks"], x["streams"]) for x in placement["workers"]] == [(3, 6), (3, 3)] and w.round == 0
    # a worker's GetDataset compares ranks: the one with 6 streams of 3 ranks is no busier
    p = Placement(str(tmp_path / "placement.json"), slot=1, own_port=7001, clock=_Clock())
    assert p.data_port() == 7001
    busy = [SlotOf(0, _worker_with_streams(metrics, 6), 7000), SlotOf(1, _worker_with_streams(metrics, 4, ranks=2), 7001)]
    clock.t += 1.0
    w.publish(busy, settled=False)  # other workers (as after a restart): counted anew
    for _ in range(SHED_WINDOW):
        clock.t += 1.0
        placement = w.publish(busy, settled=True)
    assert [x["shed"] for x in placement["workers"]] == [2, 0]  # 6 and 2 ranks: to 4 and 4


def test_a_rank_counts_once_over_its_epochs_streams_and_lingers_only_after_an_epoch_sent() -> None:
    epoch0 = pb.ReadRequest(dataset="d@1", seed=7, epoch=0, rank=3, world_size=8)
    epoch1 = pb.ReadRequest(dataset="d@1", seed=7, epoch=1, rank=3, world_size=8, start_offset=96)
    other = pb.ReadRequest(dataset="d@1", seed=7, epoch=0, rank=4, world_size=8)
    assert rank_key("10.0.0.1", epoch0) == rank_key("10.0.0.1", epoch1) != rank_key("10.0.0.2", epoch0)
    assert rank_key("10.0.0.1", epoch0) != rank_key("10.0.0.1", other)
    a0, a1, b = (rank_key("10.0.0.1", r) for r in (epoch0, epoch1, other))
    clock = _Clock()
    gauge = Gauge("ranks", "", registry=CollectorRegistry())
    tally = RankTally(gauge, linger_s=30.0, clock=clock)
    for k in (a0, a1, b):
        tally.open(k)
    assert len(tally) == 2 and gauge._value.get() == 2  # noqa: SLF001
    tally.close(a0, linger=True)
    assert len(tally) == 2  # its next epoch's stream is still open
    tally.close(a1, linger=True)  # its epoch went out whole: its client still reads it
    tally.close(b)  # moved, shed, its client left or failed: gone at once
    assert len(tally) == 1 and gauge._value.get() == 1  # noqa: SLF001
    clock.t += 29.0
    assert tally.expire() == pytest.approx(1.0) and len(tally) == 1
    tally.open(a0)  # the rank's next epoch, within the linger: the same rank, once
    assert len(tally) == 1
    tally.close(a0, linger=True)
    clock.t += 30.0
    assert tally.expire() is None and len(tally) == 0 and gauge._value.get() == 0  # noqa: SLF001


def test_the_linger_expires_without_another_stream() -> None:
    """The last rank of an idle worker leaves the count on its own (a daemon thread sweeps)."""
    tally = RankTally(linger_s=0.05)
    tally.open("k")
    tally.close("k", linger=True)
    wait_for(lambda: len(tally) == 0, "the lingering rank expired")


def test_a_worker_restarted_into_a_slot_after_a_round_has_no_share_of_it(tmp_path: Path) -> None:
    """The file names the last round until the next; a worker started into a slot after it (its
    predecessor crashed, or was drained and the slot reused) would otherwise hand back streams
    nobody asked it for on its first read."""
    clock = _Clock()
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    pids = [_worker_with_streams(metrics, 6), _worker_with_streams(metrics, 0)]
    w = PlacementWriter(tmp_path / "placement.json", metrics, CollectorRegistry(), clock)
    workers = [SlotOf(0, pids[0], 7000), SlotOf(1, pids[1], 7001)]
    for _ in range(SHED_WINDOW):
        clock.t += 1.0
        placement = w.publish(workers, settled=True)
    assert placement["round"] == 1 and placement["round_shed"] == [[0, 3]]
    clock.t += 1.0
    assert w.publish(workers, settled=True)["round_shed"] == [[0, 3]]  # stands: the same worker
    restarted = [SlotOf(0, _worker_with_streams(metrics, 0), 7000), workers[1]]
    clock.t += 1.0
    placement = w.publish(restarted, settled=False)
    assert placement["round"] == 1 and placement["round_shed"] == []
    # the new worker reads the file: nothing to hand back
    path = tmp_path / "placement.json"
    p = Placement(str(path), slot=0, own_port=7000, clock=_Clock())
    assert not p.shed_one()


def test_no_round_while_a_stream_asked_to_move_is_still_open(tmp_path: Path) -> None:
    """A stream asked to move stays open while its client reads what was sent before it: the counts
    are not what they will be, and a round on them would ask again for what is on its way."""
    clock, _, w, workers = _writer_of_two(tmp_path, {"n": 6, "moving": 1}, {"n": 0})
    for _ in range(3 * SHED_WINDOW):
        clock.t += 1.0
        assert [x["shed"] for x in w.publish(workers, settled=True)["workers"]] == [0, 0]
    assert w.round == 0


def test_a_stream_ended_unavailable_mid_way_asks_for_the_data_port_again() -> None:
    """The client side of a hand-back: the Flight error that ends a stream after its first message
    makes the connection forget its data port (the next stream asks GetDataset: a less busy worker)."""

    class Server(flight.FlightServerBase):  # type: ignore[misc]
        def do_get(self, context: object, ticket: flight.Ticket) -> flight.FlightDataStream:
            batch = pa.record_batch({"x": [1]})
            header = pb.ReadHeader(epoch=0, steps=[pb.StepInfo(step=0, rows=1)]).SerializeToString()

            def gen():  # type: ignore[no-untyped-def]
                yield batch, header
                raise to_flight_error(grpc.StatusCode.UNAVAILABLE, "rebalanced")

            return flight.GeneratorStream(batch.schema, gen())

    forgotten: list[int] = []
    with Server("grpc://127.0.0.1:0") as server, flight.FlightClient(f"grpc://127.0.0.1:{server.port}") as client:
        call = FlightCall(client, b"t", flight.FlightCallOptions(), lambda: forgotten.append(1))
        header, _ = next(call)
        assert header.steps[0].step == 0 and not forgotten
        try:
            next(call)
        except Exception as exc:  # noqa: BLE001
            assert getattr(exc, "status", None) == grpc.StatusCode.UNAVAILABLE, exc
        else:
            raise AssertionError("the stream did not fail")
    assert forgotten == [1]


@pytest.fixture
def placed_worker(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """One worker process of a supervised server as a supervisor starts it (config on stdin), with a
    placement file of the test's own: (its address, the placement file, its log)."""
    root = tmp_path / "root"
    root.mkdir()
    write_dataset(root, "moved", N_ROWS)
    ready, placement, log = tmp_path / "ready.json", tmp_path / PLACEMENT_FILE, tmp_path / "worker.log"
    cfg = ServerConfig(root=str(root), port=0, ready_file=str(ready), placement_file=str(placement))
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardstream.server.worker_process", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(dataclasses.asdict(cfg)).encode())
        proc.stdin.close()
        wait_for(lambda: ready.exists() or proc.poll() is not None, "the worker's ready file")
        assert proc.poll() is None, log.read_text()
        info = json.loads(ready.read_text())
        yield f"127.0.0.1:{info['port']}", placement, log
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("message_bytes", [1, 2000])  # a step a message; several (the move lands mid-message)
def test_a_stream_asked_to_move_hands_over_to_its_successor_without_a_gap_or_a_retry(
    placed_worker: tuple[str, Path, Path], message_bytes: int
) -> None:
    """Make before break (client/prefetch.py, ReadHeader.move_at): the worker asks the Loader's stream to
    move (the placement file says: hand back 1, slot 1 is idle); its next message names the step the
    stream ends before, the Loader opens the successor from there at once. Every sample once, in
    order; no stream ended UNAVAILABLE; the client retried nothing."""
    address, placement, log = placed_worker
    data_port = json.loads((placement.parent / "ready.json").read_text())["data_port"]
    _write(placement, 1, [(0, data_port, 5, 1), (1, data_port, 0, 0)], round_=1)  # slot 1 is this worker too
    rank_metrics = metrics.for_rank(None, 0)  # a Loader without a job
    retries = rank_metrics.retries._value.get()
    with Loader(address, "moved@1", batch_size=8, shuffle=False, epochs=1, output="arrow", columns=["id"],
                max_message_bytes=message_bytes, prefetch=1) as loader:  # fmt: skip
        got = [i for b in loader for i in b.column("id").to_pylist()]
    assert got == list(range(N_ROWS))
    assert rank_metrics.retries._value.get() == retries

    def ends() -> list[str]:
        return [line for line in log.read_text().splitlines() if "stream.end" in line]

    wait_for(lambda: len(ends()) >= 2, "the stream asked to move, and its successor, ended")
    first, second = ends()  # and no other
    # the old stream ended itself where its successor starts: the steps before move_at, no more
    # (with several steps a message, at most the rest of the message that reaches it)
    assert "outcome=OK reason=moved" in first and second.endswith("outcome=OK"), (first, second)
    sent = [int(line.split(" steps=")[1].split()[0]) for line in (first, second)]
    starts = [line for line in log.read_text().splitlines() if "stream.start" in line]
    successor_from = int(starts[1].split(" first_step=")[1].split()[0])
    assert sent[1] == -(-N_ROWS // 8) - successor_from and successor_from <= sent[0], (sent, successor_from)
    if message_bytes == 1:
        assert sent[0] == successor_from


@pytest.mark.parametrize("message_bytes", [1, 2000])  # a step a message; several, the epoch's last one short
def test_the_next_epochs_stream_is_opened_before_the_epoch_ends(
    placed_worker: tuple[str, Path, Path], monkeypatch: pytest.MonkeyPatch, message_bytes: int
) -> None:
    """The other successor: epoch 1's stream is opened while the rank still has AHEAD_STEPS steps and
    a message's worth (the most steps a message held) of epoch 0 to read — its server plans it and
    builds its first message meanwhile — and the read is still every sample once a epoch, in order."""
    address, _, _ = placed_worker
    events: list[tuple[str, int, int]] = []
    open_read = Fleet.open_read
    sizes: list[int] = []  # steps of each message of epoch 0
    decode = prefetch.decode_message

    def recorded(self: Fleet, endpoint: str, request: pb.ReadRequest, timeout_s: float | None = None) -> Any:
        events.append(("open", int(request.epoch), int(request.first_step)))
        return open_read(self, endpoint, request, timeout_s)

    def measured(spec: Any, epoch: int, layout: Any, first: int, stride: int, header: pb.ReadHeader, rows: Any) -> Any:
        if epoch == 0:
            sizes.append(len(header.steps))
        return decode(spec, epoch, layout, first, stride, header, rows)

    monkeypatch.setattr(Fleet, "open_read", recorded)
    monkeypatch.setattr(prefetch, "decode_message", measured)
    steps = -(-N_ROWS // 8)
    got: list[int] = []
    with Loader(address, "moved@1", batch_size=8, shuffle=False, epochs=2, output="arrow", columns=["id"],
                max_message_bytes=message_bytes, prefetch=1) as loader:  # fmt: skip
        for b in loader:
            assert loader.last_batch is not None
            events.append(("got", loader.last_batch.epoch, loader.last_batch.step))
            got += b.column("id").to_pylist()
    assert got == list(range(N_ROWS)) * 2
    assert [e for e in events if e[0] == "open"] == [("open", 0, 0), ("open", 1, 0)]  # one stream an epoch
    assert sum(sizes) == steps and (message_bytes == 1 or sizes[-1] < max(sizes) > 1), sizes
    assert events.index(("open", 1, 0)) < events.index(("got", 0, steps - AHEAD_STEPS - max(sizes)))
