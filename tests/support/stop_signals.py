"""A process for tests/test_workers.py: the supervisor's stop wait (StopRequest) in a loop with no
pause, so a signal lands where an Event's lock would be held; prints "stopped" for every stop seen.
Another thread keeps asking for the GIL, as the supervisor's metrics thread does while scraped."""

from __future__ import annotations

import signal
import threading

from shardstream.server.serving.supervisor import StopRequest


def _spin() -> None:
    n = 0
    while True:
        n += 1


def main() -> None:
    stop = StopRequest()
    signal.signal(signal.SIGTERM, stop.request)
    threading.Thread(target=_spin, daemon=True).start()
    print("ready", flush=True)
    while True:
        if stop.wait(0):
            stop.requested = False  # before saying so: the next signal comes after the line
            print("stopped", flush=True)
