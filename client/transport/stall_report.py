"""A Loader's stall report: what its training loop waited for data and took, told to the server it reads from.

Every `report_interval_s` (a Loader option; 0: never) a small daemon thread sends the last interval's
window to the server of the rank's stream as a Flight DoAction on its data port (no new port):

    "loader.report" {"job": J, "rank": r, "window_s": w, "wait_s": s, "samples": n, "worker": k}

J is the Loader's job (or, without one, its dataset's name), k the DataLoader worker of the rank when
its steps are split among several (split_steps; else 0); the server turns the reports of a job's
ranks into its stall ratio and consumption rate (server/serving/job_reports.py, DESIGN §11). The
training loop only adds two numbers per batch (`record`, under a lock); the call is the thread's, with
the connection's credentials (a token, or a grant with its proof over the body, as a checkpoint
call's), one attempt with a short deadline: a report that fails is logged at debug and its window
is sent with the next one (up to MAX_WINDOW_S), never raised — the fleet's scaling signal is not
worth a training step.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import pyarrow.flight as flight

from shardstream.checkpoint_format import signed_bytes

from .fleet import Fleet

__all__ = ["REPORT_ACTION", "StallReporter"]

log = logging.getLogger("shardstream.client")

REPORT_ACTION = "loader.report"
CALL_TIMEOUT_S = 5.0
MAX_WINDOW_S = 3600.0  # the server's bound on a report's window: an older unsent window is restarted


class StallReporter:
    """The reports of one iteration of a Loader (see the module docstring); `stop()` ends its thread."""

    def __init__(
        self,
        fleet: Fleet,
        endpoint: Callable[[], str],
        job: str,
        rank: int,
        interval_s: float,
        worker: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fleet = fleet
        self._endpoint = endpoint  # the server the rank's stream reads from now
        self._job, self._rank, self._worker = job, rank, worker
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._since = clock()
        self._wait_s = 0.0
        self._samples = 0
        self.sent = 0  # reports the server took
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"shardstream-report-r{rank}", daemon=True)
        self._thread.start()

    def record(self, waited_s: float, samples: int) -> None:
        """The training loop waited `waited_s` for a batch of `samples` samples."""
        with self._lock:
            self._wait_s += waited_s
            self._samples += samples

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=CALL_TIMEOUT_S + 1)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.send()

    def send(self) -> bool:
        """Send the window since the last report that the server took; whether it took this one."""
        now = self._clock()
        with self._lock:
            window = now - self._since
            wait_s, samples = min(self._wait_s, window), self._samples
        if window <= 0:
            return False
        body = {
            "job": self._job, "rank": self._rank, "window_s": window, "wait_s": wait_s, "samples": samples,
            "worker": self._worker,
        }  # fmt: skip
        try:
            self._call(json.dumps(body).encode())
        except Exception as exc:  # noqa: BLE001 — a report is never worth a training step
            log.debug("the stall report to %s failed (its window goes with the next): %s", self._endpoint(), exc)
            if window > MAX_WINDOW_S:
                self._take(now, wait_s, samples)
            return False
        self._take(now, wait_s, samples)
        self.sent += 1
        return True

    def _take(self, now: float, wait_s: float, samples: int) -> None:
        with self._lock:  # what the loop added since `now` stays for the next window
            self._since = now
            self._wait_s = max(0.0, self._wait_s - wait_s)
            self._samples -= samples

    def _call(self, raw: bytes) -> None:
        plane = self._fleet.conn(self._endpoint()).data_plane(None)
        options = plane.options(signed_bytes(REPORT_ACTION, raw), CALL_TIMEOUT_S)
        list(plane.client.do_action(flight.Action(REPORT_ACTION, raw), options))
