"""Streams spread over a supervisor's workers (server/serving/rebalance.py, placement.py): the pure rules
as properties, the placement file between a writer and a worker's reader, and the client following a
stream its worker hands back. The end-to-end run on real processes is tests/test_autoscale_workers.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.flight as flight
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from shardstream.client.transport.flight_call import FlightCall
from shardstream.errors import to_flight_error
from shardstream.server.serving.placement import (
    READ_INTERVAL_S,
    SHED_WINDOW,
    Placement,
    PlacementWriter,
    SlotOf,
    streams_by_pid,
)
from shardstream.server.serving.rebalance import MIN_SPREAD, pick_slot, plan_shed
from shardstream.v1 import shardstream_pb2 as pb

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


def _write(path: Path, generation: int, workers: list[tuple[int, int, int, int]]) -> None:
    body = {"generation": generation, "workers": [{"slot": s, "data_port": p, "streams": n, "shed": k} for s, p, n, k in workers]}
    path.write_text(json.dumps(body))


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_worker_reads_the_placement_names_ports_and_hands_back_its_share_once_per_generation(tmp_path: Path) -> None:
    path, clock = tmp_path / "placement.json", _Clock()
    p = Placement(str(path), 0, 7000, clock)
    assert p.data_port() == 7000 and not p.shed_one()  # no file yet: as a single worker
    _write(path, 1, [(0, 7000, 6, 2), (1, 7001, 0, 0)])
    clock.t += READ_INTERVAL_S
    assert [p.data_port() for _ in range(5)] == [7001] * 4 + [7000]  # 6 - 2 handed back: 4 and 0 -> 4 and 4, a tie: its own
    assert [p.shed_one() for _ in range(3)] == [True, True, False]  # its share, once
    clock.t += READ_INTERVAL_S
    assert not p.shed_one()  # the same generation read again: nothing more
    _write(path, 2, [(0, 7000, 4, 0), (1, 7001, 4, 0)])
    clock.t += READ_INTERVAL_S
    assert not p.shed_one() and p.data_port() == 7000
    path.write_text("{torn")  # a torn or foreign file keeps what was read
    clock.t += READ_INTERVAL_S
    assert p.data_port() in (7000, 7001)


def _worker_with_streams(metrics: Path, n: int) -> int:
    """A process that counts `n` Read streams in the multiprocess files, as a worker does; its pid."""
    code = (
        "import os; from shardstream.server.serving.stream_runtime import STREAMS_ACTIVE; "
        f"STREAMS_ACTIVE.labels('d').inc({n}); print(os.getpid())"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
    return int(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout)


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
    assert sheds(on=workers[:1]) == [0]  # another set of workers: counted anew
    assert registry.get_sample_value("shardstream_rebalance_rounds_total") == 1
    assert registry.get_sample_value("shardstream_worker_streams", {"worker": "0"}) == 6
    assert registry.get_sample_value("shardstream_worker_streams", {"worker": "1"}) is None  # gone: its series too
    assert not w.due()


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
