"""The Loader's client, in process: CPU per message of `Loader` against a plain reader of the same messages.

    python -m loadtest.client_bench [--messages 400] [--rounds 7] [--steps 1] [--output arrow]
                                    [--evict-mib 4] [--profile] [--json PATH]

No server, no network: messages as a shardstream server sends them for one rank of world size 1,
unshuffled — `id` int64 + `vec` fixed_size_list<float32>[256] (1,032 B/row, `loadtest.bench`'s
rows) and the provenance columns `_shard`/`_row`, 2,032 rows (2 MiB) a message, `--steps` steps a
message — each with its serialized ReadHeader, prepared once. Two paths read them, alternating
round by round (A B, B A, ...) after a warm-up:

    plain    what loadtest.flight_bench's `doget` client does with each Flight chunk past
             `read_chunk`: takes its record batch and the size of its app_metadata
    loader   `Loader(output=--output)` (world size 1, `epochs` = messages / messages an epoch) over a
             `ReadCall` that hands over the prepared messages as `FlightCall` does past `read_chunk`
             (the header parsed from its bytes, `plain_batch`): the Loader's prefetch thread,
             StreamSession, decode (steps, provenance, the cursor), the queue and `__iter__`

The Loader is a subclass whose fleet session (its `Fleet`, client/transport/fleet.py: the seam
between the Loader and the wire) is a `MemoryFleet`: `find_dataset` answers from the prepared
dataset and `open_read` opens the in-memory call; everything else is the client as a trainer runs it.
`read_chunk` itself (the socket, gRPC, Arrow's IPC decode) costs both paths the same and is left
out, so `loader - plain` is the Loader's own cost per message; add it to a plain reader's CPU per
message through Flight (flight_bench: ~700 us for 2 MiB here) for the ratio flight_bench measures.
Before each message, both paths write one byte in every cache line of `--evict-mib` MiB (default 4;
0: none), as a real client's network receive copies each 2 MiB message through the CPU's caches:
the Loader's Python then runs with the cold caches it has in a trainer, where it costs up to twice
what it costs warm (2026-11-27, `loader - plain`: 43-62 us a message evicted against 32-36 warm;
over a real server the Loader's process spends ~45-78 us a message more than a plain reader's). The
writes cost both paths the same and cancel in `loader - plain`.
Per round: CPU microseconds per message (`time.process_time`: both threads of the Loader count);
median (min-max) over rounds, and `loader - plain` per round. `--profile`: cProfile of one
Loader pass, both threads, the top functions by own time. Figures only; it exits 0.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from loadtest.bench import DIM, ROW_BYTES
from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from shardstream.client import Loader
from shardstream.extension_types import plain_batch
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["main", "run"]

DATASET = "bench"
BATCH_ROWS = 2032  # 2.00 MiB of 1,032 B rows, as flight_bench's batches
MESSAGES_PER_EPOCH = 16
PATHS = ("plain", "loader")


def _message_batch(first_row: int, rows: int) -> pa.RecordBatch:
    """One message's rows as the server sends them (data columns, then the provenance)."""
    ids = np.arange(first_row, first_row + rows, dtype=np.int64)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(rows * DIM, np.float32)), DIM)
    return pa.RecordBatch.from_arrays(
        [pa.array(ids), vec, pa.array(np.zeros(rows, np.int32)), pa.array(ids)],
        names=["id", "vec", "_shard", "_row"],
    )


class Stream:
    """The prepared messages of every epoch: (serialized ReadHeader, record batch) each."""

    def __init__(self, messages_per_epoch: int, steps: int) -> None:
        self.steps = steps  # steps a message
        self.step_rows = BATCH_ROWS // steps
        self.num_rows = messages_per_epoch * steps * self.step_rows
        self.batches = [
            _message_batch(m * steps * self.step_rows, steps * self.step_rows)
            for m in range(messages_per_epoch)
        ]
        self._headers: dict[int, list[bytes]] = {}

    def headers(self, epoch: int) -> list[bytes]:
        """Each message's serialized ReadHeader in `epoch` (as server/read/build.py writes them)."""
        found = self._headers.get(epoch)
        if found is None:
            found = []
            b = self.step_rows
            for m in range(len(self.batches)):
                header = pb.ReadHeader(epoch=epoch, stream_id="bench")
                for k in range(m * self.steps, (m + 1) * self.steps):
                    header.steps.add(
                        step=k,
                        position_start=k * b,
                        position_end=(k + 1) * b,
                        global_start=k * b,
                        global_end=(k + 1) * b,
                        rows=b,
                    )
                header.end_of_epoch = m == len(self.batches) - 1
                found.append(header.SerializeToString())
            self._headers[epoch] = found
        return found

    def info(self) -> pb.DatasetInfo:
        return pb.DatasetInfo(
            name=DATASET,
            version=1,
            fingerprint="0" * 64,
            num_rows=self.num_rows,
            num_shards=1,
            fields=[
                pb.Field(name="id", type="int64"),
                pb.Field(name="vec", type=f"fixed_size_list<item: float>[{DIM}]"),
            ],
        )


class Evict:
    """What a network receive does to the CPU's caches, on demand: one write in every cache line of
    `mib` MiB (none when 0)."""

    def __init__(self, mib: int) -> None:
        self._lines = np.zeros(max(0, mib) << 20, np.uint8)[::64]

    def __call__(self) -> None:
        if len(self._lines):
            self._lines += 1


class MemoryCall:
    """A `ReadCall` (client/transport/flight_call.py) over prepared messages: what `FlightCall.__next__` does
    past `read_chunk` — the header parsed from its bytes, the batch through `plain_batch` — after
    `evict` (the receive's copy)."""

    stream_id = "bench"

    def __init__(self, stream: Stream, request: pb.ReadRequest, evict: Evict) -> None:
        first = request.first_step // stream.steps  # (a whole epoch from its start: first_step 0)
        self._it = zip(stream.headers(request.epoch)[first:], stream.batches[first:], strict=True)
        self._evict = evict

    def __iter__(self) -> MemoryCall:
        return self

    def __next__(self) -> tuple[pb.ReadHeader, pa.RecordBatch]:
        meta, batch = next(self._it)
        self._evict()
        return pb.ReadHeader.FromString(meta), plain_batch(batch)

    def cancel(self) -> None:
        pass


class MemoryFleet:
    """The Loader's side of a `Fleet` (client/transport/fleet.py) over the prepared stream: its
    GetDataset and Read calls, and no channel."""

    connected = False

    def __init__(self, stream: Stream, evict: Evict) -> None:
        self._stream = stream
        self._evict = evict

    def find_dataset(self, dataset: str, first: int) -> pb.DatasetInfo:
        return self._stream.info()

    def open_read(self, endpoint: str, request: pb.ReadRequest, timeout_s: float | None = None) -> Any:
        return MemoryCall(self._stream, request, self._evict)

    def close(self) -> None:
        pass


class MemoryLoader(Loader):
    """A Loader whose fleet is a `MemoryFleet`: its dataset and Read calls are the prepared stream's
    (no channel is opened, no stall report sent)."""

    def __init__(self, stream: Stream, evict: Evict, **options: Any) -> None:
        super().__init__(["127.0.0.1:1"], DATASET, report_interval_s=0, **options)
        self._fleet = MemoryFleet(stream, evict)  # type: ignore[assignment]


def plain_pass(stream: Stream, epochs: int, evict: Evict) -> int:
    """flight_bench's plain reader past `read_chunk`: each message's batch and metadata size."""
    n = received = 0
    for epoch in range(epochs):
        for meta, batch in zip(stream.headers(epoch), stream.batches, strict=True):
            evict()
            received += len(meta)
            batch.num_rows  # noqa: B018 — the chunk's `data`, touched as the plain reader does
            n += 1
    return n


def loader_pass(stream: Stream, epochs: int, output: str, evict: Evict) -> int:
    """A whole Loader read; the messages it received."""
    steps = 0
    with MemoryLoader(
        stream, evict, batch_size=stream.step_rows, output=output, world_size=1, rank=0, epochs=epochs
    ) as loader:
        for _ in loader:
            steps += 1
    return steps // stream.steps


def _cpu_us_per_message(fn: Callable[[], int]) -> float:
    c0 = time.process_time()
    n = fn()
    return (time.process_time() - c0) / n * 1e6


def profile_loader(stream: Stream, epochs: int, output: str, evict: Evict, top: int = 20) -> str:
    """cProfile of one Loader pass, its prefetch thread included: the top functions by own time."""
    profile = cProfile.Profile()
    threading.setprofile(lambda *_: profile.enable())  # ... in threads started from here on
    profile.enable()
    try:
        loader_pass(stream, epochs, output, evict)
    finally:
        profile.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def run(args: argparse.Namespace) -> dict[str, Any]:
    stream = Stream(MESSAGES_PER_EPOCH, args.steps)
    epochs = max(1, args.messages // MESSAGES_PER_EPOCH)
    evict = Evict(args.evict_mib)
    paths: dict[str, Callable[[], int]] = {
        "plain": lambda: plain_pass(stream, epochs, evict),
        "loader": lambda: loader_pass(stream, epochs, args.output, evict),
    }
    for fn in paths.values():  # warm-up (imports, the header cache, the first Loader)
        fn()
    per: dict[str, list[float]] = {p: [] for p in PATHS}
    for round_ in range(args.rounds):
        for name in PATHS if round_ % 2 == 0 else PATHS[::-1]:
            per[name].append(_cpu_us_per_message(paths[name]))
        log(f"  round {round_ + 1}: " + "  ".join(f"{p} {per[p][-1]:.1f} us" for p in PATHS))
    extra = [a - b for a, b in zip(per["loader"], per["plain"], strict=True)]
    message_bytes = BATCH_ROWS // args.steps * args.steps * ROW_BYTES
    result: dict[str, Any] = {
        "command": " ".join(["python", "-m", "loadtest.client_bench", *sys.argv[1:]]),
        "config": {
            "messages_per_pass": epochs * MESSAGES_PER_EPOCH,
            "steps_per_message": args.steps,
            "message_bytes": message_bytes,
            "output": args.output,
            "evict_mib": args.evict_mib,
            "rounds": args.rounds,
        },
        "versions": versions("shardstream"),
        "cpu_us_per_message": {p: spread(v) for p, v in per.items()},
        "loader_minus_plain_us": spread(extra),
        "loader_extra_cpu_s_per_gb": spread([e * 1e-6 * 1e9 / message_bytes for e in extra]),
        "rounds": per,
    }
    if args.profile:
        result["profile"] = profile_loader(stream, epochs, args.output, evict)
    return result


def print_report(result: dict[str, Any]) -> None:
    c = result["config"]
    print(
        f"client A/B in process: {c['messages_per_pass']} messages of {c['message_bytes'] / (1 << 20):.2f} MiB "
        f"({c['steps_per_message']} step(s) each), output={c['output']}, {c['rounds']} rounds, "
        f"{c.get('evict_mib', 0)} MiB evicted a message"
    )
    for p, s in result["cpu_us_per_message"].items():
        print(f"  {p:<7} {s['median']:8.1f} us/message ({s['min']:.1f}-{s['max']:.1f})")
    e, g = result["loader_minus_plain_us"], result["loader_extra_cpu_s_per_gb"]
    print(
        f"  loader - plain per round: {e['median']:.1f} us/message ({e['min']:.1f}-{e['max']:.1f}) = "
        f"{g['median']:.3f} CPU-s/GB"
    )
    if "profile" in result:
        print(result["profile"])


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.client_bench", __doc__ or "")
    ap.add_argument("--messages", type=int, default=400, help="messages a pass (default 400)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds after the warm-up (default 7)")
    ap.add_argument("--steps", type=int, default=1, help="steps a 2 MiB message (default 1)")
    ap.add_argument("--output", choices=("arrow", "numpy", "torch"), default="arrow")
    ap.add_argument(
        "--evict-mib",
        type=int,
        default=4,
        help="MiB written through the caches before each message, as a network receive does (default 4; 0: none)",
    )
    ap.add_argument("--profile", action="store_true", help="cProfile of one Loader pass (both threads)")
    return bench_main(ap, argv, run, json_default=results_path("client_bench"), report=print_report)


if __name__ == "__main__":
    sys.exit(main())
