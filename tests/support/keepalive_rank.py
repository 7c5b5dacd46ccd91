"""A Loader in a process of its own for tests/test_keepalive.py (gRPC reads GRPC_TRACE at start).

    python -m tests.support.keepalive_rank TARGET DATASET DIR KEEPALIVE_MS [eager]

Its data plane's keepalive time is KEEPALIVE_MS (the shipped options otherwise; `eager`: the options
before they matched gRPC's default server policy — pings without calls, any number without data).
It reads one batch, writes DIR/paused and waits for DIR/go (a training step: the prefetch queue full,
the stream waiting), reads the epoch to its end, writes DIR/read (the batches read), waits for
DIR/go-idle (the Loader idle, no call on its data plane) and exits 0.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import shardstream.client.transport.channel as channel
from shardstream.client import Loader

GO_TIMEOUT_S = 300.0  # a hang guard: the test writes the go files


def _wait(path: Path) -> None:
    parent, deadline = os.getppid(), time.monotonic() + GO_TIMEOUT_S
    while not path.exists():
        if os.getppid() != parent or time.monotonic() > deadline:
            raise SystemExit(f"no {path.name} from the test")
        time.sleep(0.01)


def main(target: str, dataset: str, workdir: str, keepalive_ms: str, *mode: str) -> int:
    d = Path(workdir)
    if mode == ("eager",):
        channel.FLIGHT_OPTIONS[:] = [
            (k, v) for k, v in channel.CHANNEL_OPTIONS if k.startswith(("grpc.keepalive", "grpc.http2"))
        ]
    channel.FLIGHT_OPTIONS[:] = [
        (k, int(keepalive_ms) if k == "grpc.keepalive_time_ms" else v) for k, v in channel.FLIGHT_OPTIONS
    ]
    with Loader([target], dataset, batch_size=256, prefetch=1, shuffle="none", epochs=1) as ld:
        it = iter(ld)
        n = len(next(it)["id"])
        (d / "paused").write_text("")
        _wait(d / "go")
        batches = 1
        for b in it:
            n += len(b["id"])
            batches += 1
        (d / "read").write_text(f"{batches} {n}")
        _wait(d / "go-idle")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
