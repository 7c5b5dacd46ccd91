"""A supervisor's placement file: every worker's Read streams, published by the supervisor, read by its
workers, so that streams spread over workers added or restarted while ranks read (rules: rebalance.py).

The supervisor (`PlacementWriter`, supervisor.py) counts each serving worker's ranks every
PUBLISH_INTERVAL_S from the multiprocess metric files it already sums for /metrics
(`shardstream_ranks_active`, kept per process there: `RankTally`) and writes `placement.json` in its
private directory, atomically: a generation, and for each serving worker its slot, the data port
GetDataset names for it, its ranks and streams, and the streams it is asked to hand back
(`rebalance.plan_shed` over each worker's mean of the last SHED_WINDOW counts of ranks, so that
streams ending and starting — a new epoch is a new stream — do not look like an imbalance; the
window starts again after a round and whenever a worker starts or drains: a round only on counts
that settled). Ranks, not streams: a rank holds two streams while its next epoch's opens beside the
last messages of the current one (client/prefetch.py), one most of the time when epochs are short,
and a count of streams swung with epoch boundaries into rounds that undid each other. A rank is its
client's host and its request's dataset, seed, rank and world size (`rank_key`), counted while a
stream of it is open and RANK_LINGER_S after one sent its epoch's last message (`RankTally`: its
client reads on from what it holds before it opens the next epoch's).
Each round is logged and counted (`shardstream_rebalance_rounds_total` at the supervisor, beside
`shardstream_worker_ranks{worker=SLOT}` and `shardstream_worker_streams{worker=SLOT}`).

Each worker (`Placement`; ServerConfig.placement_file and worker_slot, set by the supervisor only) reads
the file when it changed, at most every READ_INTERVAL_S: its GetDataset names the data port
`rebalance.pick_slot` picks (its own while none is less busy), and its streams hand themselves back,
as many as the last round asked of it (the file names that round in every generation until the
next; `shardstream_streams_rebalanced_total`). A stream whose client opens the successor itself
(ReadRequest.handover: the client's single stream of a rank) names in its next message's header the
step it stops before (`move_at`, HANDOVER_AHEAD_STEPS steps on) and goes on to there, then ends (OK);
the client opens a stream from that step as soon as it reads the header (asking GetDataset again: on
the less busy worker) — make before break, so the rank does not wait for the new stream's first
message (client/prefetch.py). While any such stream is open (`shardstream_streams_moving`) the counts
are not settled: no round. The others end at the next step boundary with UNAVAILABLE, and their
client resumes at the first step it has not received, after asking GetDataset again
(client/transport/flight_call.py).
A single server process has no placement: GetDataset names its own port, no stream is ended.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.multiprocess import MultiProcessCollector

from .ready import write_ready_file
from .rebalance import pick_slot, plan_shed

__all__ = [
    "HANDOVER_AHEAD_STEPS",
    "PLACEMENT_FILE",
    "RANKS",
    "RANKS_ACTIVE",
    "RANK_LINGER_S",
    "REBALANCED",
    "STREAMS_MOVING",
    "STREAMS_REBALANCED",
    "Placement",
    "PlacementWriter",
    "RankTally",
    "SlotOf",
    "live_by_pid",
    "lives_by_pid",
    "rank_key",
    "streams_by_pid",
]

log = logging.getLogger("shardstream.server.serving.placement")

PLACEMENT_FILE = "placement.json"
PUBLISH_INTERVAL_S = 1.0  # the supervisor's count of every worker's streams
SHED_WINDOW = 5  # counts (one a PUBLISH_INTERVAL_S) a shed round looks at: 5 s between rounds at least
READ_INTERVAL_S = 0.5  # a worker looks at the file at most this often
REBALANCED = (
    "rebalanced: this server's worker carries more streams than another; the stream resumes on a less busy one"
)
# A stream asked to move whose client opens the successor (ReadHeader.move_at) goes on for this many
# of its steps after the message that says so: its successor plans and builds its first message meanwhile.
HANDOVER_AHEAD_STEPS = 4
# A rank whose stream sent its epoch's last message counts this long after (RankTally): its client
# still reads what it holds, then opens the next epoch's stream (1-15 s later in the autoscale benchmark).
RANK_LINGER_S = 30.0
_ACTIVE = "shardstream_streams_active"
_MOVING = "shardstream_streams_moving"
_RANKS = "shardstream_ranks_active"

STREAMS_REBALANCED = Counter(
    "shardstream_streams_rebalanced_total",
    "Read streams a worker ended at a step boundary so that a less busy worker of its server takes them (placement.py)",
)

STREAMS_MOVING = Gauge(
    "shardstream_streams_moving",
    "Read streams a worker asked to move that are still open (placement.py; no shed round while any is)",
    multiprocess_mode="livesum",
)


RANKS_ACTIVE = Gauge(
    _RANKS,
    "Trainer ranks this server serves: a Read stream open, or its epoch sent within RANK_LINGER_S (placement.py)",
    multiprocess_mode="livesum",
)


def rank_key(peer_host: str, request: Any) -> tuple[Any, ...]:
    """A trainer rank as a worker tells it from its streams: its host and its ReadRequest's dataset
    (refs or mixture), seed, rank and world size — the same for each epoch's stream of the rank."""
    dataset = request.dataset or tuple((m.dataset, m.weight) for m in request.mixture)
    return (peer_host, dataset, request.seed, request.rank, request.world_size)


class RankTally:
    """The ranks this worker serves: each with a stream open here (`open` at a stream's start, `close`
    at its end), and for RANK_LINGER_S more each whose last stream ended having sent its epoch
    (`close(..., linger=True)`): the server sends an epoch's last message while its client still
    holds several (gRPC's buffers, the prefetch queue), and the rank opens its next epoch's stream
    only a few steps before it needs it — 1-15 s later in the autoscale benchmark, in which the rank
    would count nowhere. A stream moved or shed, one whose client left and one that failed do not
    linger: the rank is elsewhere, or gone. `gauge` (RANKS_ACTIVE for the process's tally) is set to
    the count at each change; a daemon thread expires what lingers while anything does."""

    def __init__(
        self, gauge: Any = None, linger_s: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._gauge = gauge
        self._linger_s = linger_s
        self._clock = clock
        self._open: Tally[Any] = Tally()
        self._lingering: dict[Any, float] = {}  # key -> until when it still counts
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None

    def open(self, key: Any) -> None:
        with self._lock:
            self._lingering.pop(key, None)
            self._open[key] += 1
            self._publish()

    def close(self, key: Any, linger: bool = False) -> None:
        with self._lock:
            self._open[key] -= 1
            if self._open[key] > 0:
                return
            del self._open[key]
            if linger and self._linger_s > 0:
                self._lingering[key] = self._clock() + self._linger_s
                if self._sweeper is None:
                    self._sweeper = threading.Thread(target=self._sweep, name="rank-linger", daemon=True)
                    self._sweeper.start()
            self._publish()

    def expire(self) -> float | None:
        """Forget the ranks whose linger ran out; seconds until the next one does (None: none left)."""
        now = self._clock()
        with self._lock:
            for key in [k for k, until in self._lingering.items() if until <= now]:
                del self._lingering[key]
            self._publish()
            if not self._lingering:
                self._sweeper = None  # the next linger starts another
                return None
            return min(self._lingering.values()) - now

    def _sweep(self) -> None:
        while (wait := self.expire()) is not None:
            time.sleep(max(wait, 0.01))

    def _publish(self) -> None:  # under the lock
        if self._gauge is not None:
            self._gauge.set(len(self._open) + len(self._lingering))

    def __len__(self) -> int:
        with self._lock:  # a key is in one of the two: `open` takes it out of lingering, `close` out of open
            return len(self._open) + len(self._lingering)


RANKS = RankTally(RANKS_ACTIVE, RANK_LINGER_S)  # this process's (its streams, in data_plane.py)


@dataclass(frozen=True)
class SlotOf:
    """A serving worker as the supervisor publishes it."""

    slot: int
    pid: int
    data_port: int  # the port GetDataset names for it (advertised, else bound)


def lives_by_pid(metrics_dir: Path, names: Sequence[str]) -> dict[str, dict[int, float]]:
    """Each live worker's own value of each `livesum` gauge in `names` (summed over its labels), read
    from the per-process files before they are summed (prometheus_client's `_read_metrics`, the step of
    `collect` that keeps each process apart, labelling each value with its pid), in one read of the
    files; {} for each where that changes."""
    files = [str(f) for f in metrics_dir.glob("gauge_livesum_*.db")]
    out: dict[str, dict[int, float]] = {name: {} for name in names}
    try:
        metrics = MultiProcessCollector._read_metrics(files)  # noqa: SLF001
    except (AttributeError, TypeError, ValueError, OSError):
        return out
    for name in names:
        metric, by_pid = metrics.get(name), out[name]
        for sample in metric.samples if metric is not None else ():
            try:
                pid = int(dict(sample.labels)["pid"])
            except (KeyError, ValueError):
                continue
            by_pid[pid] = by_pid.get(pid, 0.0) + sample.value
    return out


def live_by_pid(metrics_dir: Path, name: str) -> dict[int, float]:
    """Each live worker's own value of the `livesum` gauge `name` (lives_by_pid)."""
    return lives_by_pid(metrics_dir, (name,))[name]


def streams_by_pid(metrics_dir: Path) -> dict[int, int]:
    """Each live worker's open Read streams."""
    return {pid: int(n) for pid, n in live_by_pid(metrics_dir, _ACTIVE).items()}


class PlacementWriter:
    """The supervisor's side: counts, plans a shed round when due, writes the file."""

    def __init__(
        self, path: Path, metrics_dir: Path, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.metrics_dir = metrics_dir
        self._clock = clock
        self.generation = 0
        self.round = 0  # the last shed round, and what it asked of each slot: in every generation after it
        self._round_shed: dict[int, int] = {}
        self._pids: dict[int, int] = {}  # the worker process of each slot at the last count
        self._next_publish = 0.0
        self._window: deque[dict[int, int]] = deque(maxlen=SHED_WINDOW)  # the last counts, same workers
        self.rounds = Counter(
            "shardstream_rebalance_rounds_total",
            "Rounds in which busy workers were asked to hand streams to less busy ones (placement.py)",
            registry=registry,
        )
        self.streams = Gauge(
            "shardstream_worker_streams", "Read streams each worker process carries, by slot (placement.py)", ["worker"], registry=registry
        )
        self.ranks = Gauge(
            "shardstream_worker_ranks",
            "Trainer ranks each worker process serves, by slot: what rebalance rounds even out (placement.py)",
            ["worker"],
            registry=registry,
        )
        self._labelled: set[int] = set()

    def due(self) -> bool:
        return self._clock() >= self._next_publish

    def publish(self, workers: Sequence[SlotOf], *, settled: bool) -> dict[str, Any]:
        """Count and write; a shed round only when `settled` (every worker serving, none draining)
        for the last SHED_WINDOW counts, on their means. The published placement."""
        now = self._clock()
        self._next_publish = now + PUBLISH_INTERVAL_S
        live = lives_by_pid(self.metrics_dir, (_ACTIVE, _MOVING, _RANKS))  # one read of the files a count
        streams = {w.slot: int(live[_ACTIVE].get(w.pid, 0)) for w in workers}
        ranks = {w.slot: int(live[_RANKS].get(w.pid, 0)) for w in workers}  # what a round evens out
        # streams asked to move and still open (a client opening its successor, or reading what was
        # sent before it): the counts are not what they will be, so not a round's
        moving = live[_MOVING]
        settled = settled and not any(moving.get(w.pid, 0) > 0 for w in workers)
        for w in workers:  # a worker started into a slot after the round (restarted) has no share of it
            if self._pids.get(w.slot) != w.pid:
                self._round_shed.pop(w.slot, None)
        self._pids = {w.slot: w.pid for w in workers}
        for slot in self._labelled - set(streams):  # a worker gone (drained, or being replaced)
            self.streams.remove(str(slot))
            self.ranks.remove(str(slot))
        for slot, n in streams.items():
            self.streams.labels(str(slot)).set(n)
            self.ranks.labels(str(slot)).set(ranks[slot])
        self._labelled = set(streams)
        if not settled or (self._window and self._window[-1].keys() != ranks.keys()):
            self._window.clear()  # a worker starts, drains or was replaced: count again
        if settled:
            self._window.append(ranks)
        shed: dict[int, int] = {}
        if len(self._window) == SHED_WINDOW:
            means = {slot: round(sum(c[slot] for c in self._window) / SHED_WINDOW) for slot in ranks}
            shed = {slot: min(k, streams[slot]) for slot, k in plan_shed(means).items() if streams[slot]}
            if shed:
                self._window.clear()  # the next round looks at counts made after this one
                self.rounds.inc()
                self.round += 1
                self._round_shed = shed
                log.info(
                    "rebalance: ranks per worker slot %s (mean of the last %d counts); asking %s to hand back %s",
                    dict(sorted(means.items())),
                    SHED_WINDOW,
                    "slot " + ", ".join(str(s) for s in sorted(shed)),
                    ", ".join(str(shed[s]) for s in sorted(shed)),
                )
        self.generation += 1
        placement = {
            "generation": self.generation,
            # the last round, in every generation until the next: a worker reads the file only as
            # its streams pass step boundaries (seconds apart with large messages), and would miss a
            # round published for one generation only
            "round": self.round,
            "round_shed": [[slot, k] for slot, k in sorted(self._round_shed.items())],
            "workers": [
                {
                    "slot": w.slot,
                    "data_port": w.data_port,
                    "ranks": ranks[w.slot],
                    "streams": streams[w.slot],
                    "shed": shed.get(w.slot, 0),
                }
                for w in workers
            ],
        }
        write_ready_file(str(self.path), placement)  # atomic: a worker reads all of it or the previous
        return placement


class Placement:
    """A worker's side: the data port a GetDataset names, and whether a stream should end now."""

    def __init__(self, path: str, slot: int, own_port: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.slot = slot
        self.own_port = own_port
        self._clock = clock
        self._lock = threading.Lock()
        self._next_read = 0.0
        self._stamp: tuple[int, int] | None = None  # the file's (mtime_ns, size) last read
        self.generation = -1
        self._ranks: dict[int, int] = {}  # the ranks each slot carries, as last counted
        self._ports: dict[int, int] = {}
        self._shed: dict[int, int] = {}
        self._given: Tally[int] = Tally()  # streams sent to each slot since the count
        self._to_shed = 0  # this worker's streams still to hand back in the last round
        self._round = 0  # the last round read

    def _refresh(self) -> None:
        """Read the file if it changed (at most every READ_INTERVAL_S); a missing or torn file keeps
        what was read before."""
        now = self._clock()
        with self._lock:
            if now < self._next_read:
                return
            self._next_read = now + READ_INTERVAL_S
            try:
                st = self.path.stat()
                if (st.st_mtime_ns, st.st_size) == self._stamp:
                    return
                data = json.loads(self.path.read_text())
                generation = int(data["generation"])
                workers = [
                    (int(w["slot"]), int(w["data_port"]), int(w.get("ranks", w["streams"])), int(w["shed"]))
                    for w in data["workers"]
                ]
                round_ = int(data.get("round", 0))
                round_shed = {int(slot): int(k) for slot, k in data.get("round_shed", ())}
            except (OSError, ValueError, KeyError, TypeError):
                return
            self._stamp = (st.st_mtime_ns, st.st_size)
            if generation == self.generation:
                return
            self.generation = generation
            self._ports = {slot: port for slot, port, _, _ in workers if port}
            self._ranks = {slot: n for slot, port, n, _ in workers if port}
            self._shed = {slot: k for slot, _, _, k in workers if k}
            self._given.clear()
            if round_ != self._round:  # a round: this worker's share of it stands until the next round
                # (a stream reaches a step boundary only as fast as its client reads: seconds apart)
                self._round = round_
                self._to_shed = round_shed.get(self.slot, 0)

    def data_port(self) -> int:
        """The data port to name in a GetDataset answer (rebalance.pick_slot), counted as given."""
        self._refresh()
        with self._lock:
            slot = pick_slot(self._ranks, self.slot, self._shed, self._given)
            self._given[slot] += 1
            return self._ports.get(slot, self.own_port)

    def shed_one(self) -> bool:
        """Whether the calling stream should end now to be taken by a less busy worker (then counted).
        Per message of every stream: a clock read while there is nothing to hand back."""
        if self._to_shed <= 0 and self._clock() < self._next_read:
            return False
        self._refresh()
        with self._lock:
            if self._to_shed <= 0:
                return False
            self._to_shed -= 1
        STREAMS_REBALANCED.inc()
        return True
