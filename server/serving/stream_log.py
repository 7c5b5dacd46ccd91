"""One log line when a Read stream starts and one when it ends, under an id the client sees too.

Every Read stream gets a stream id (16 hex digits), sent to the client in the initial metadata
(`x-shardstream-stream-id`) before anything else; the client's failover lines name it
(client/transport/session.py), so one id leads from a trainer's log to the server's lines of that stream:

    stream.start stream_id=… peer=ipv4:10.0.0.7:53412 dataset=web@3 rank=2 world_size=8 batch_size=32
                 epoch=0 offset=40960 first_step=0 stride=1
    stream.end   stream_id=… peer=… dataset=web@3 rank=2 world_size=8 epoch=0 offset=40960
                 steps=120 rows=3840 bytes=52428800 duration_s=8.210 outcome=OK

`outcome` is the stream's status as grpc_server_handled_total spells it (OK, InvalidArgument,
DataLoss, ...), or Canceled with a `reason` when the client left or was cut by the write timeout;
an error's message (as the client got it) is `error`. Streams refused at admission (overload) get
one `stream.refused` line at DEBUG only: under overload there may be thousands a second, and
shardstream_streams_refused_total counts them. Errors the server is to blame for (Internal, DataLoss,
Unavailable, Unknown) end at WARNING, the others at INFO. `peer` is gRPC's (`ipv4:10.0.0.7:53412`).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from shardstream.ipc import STREAM_ID_METADATA
from shardstream.v1 import shardstream_pb2 as pb

from ..policy.dataset_label import OTHER
from .log_format import log_event

__all__ = ["STREAM_ID_KEY", "StreamLog", "new_stream_id"]

log = logging.getLogger("shardstream.server.streams")

STREAM_ID_KEY = STREAM_ID_METADATA
_SERVER_FAULTS = ("Internal", "DataLoss", "Unavailable", "Unknown")


def new_stream_id() -> str:
    return secrets.token_hex(8)


@dataclass
class StreamLog:
    """What one stream asked for and did, logged at its start and end."""

    stream_id: str
    peer: str
    started_s: float = field(default_factory=time.monotonic)
    request: dict[str, Any] = field(default_factory=dict)
    dataset: str = ""  # the pinned version(s) once planned ("web@3", "web@3, code@1"), else as asked
    label: str = OTHER  # its metrics' `dataset` label (policy/dataset_label.py)
    steps: int = 0
    rows: int = 0
    bytes: int = 0
    outcome: str = "Canceled"  # until the stream ends otherwise
    reason: str = ""
    error: str = ""

    def asked(self, request: pb.ReadRequest | None) -> None:
        """Record the request (None: it did not parse)."""
        if request is None:
            return
        self.dataset = request.dataset or ",".join(s.dataset for s in request.mixture)
        self.request = {
            "rank": request.rank,
            "world_size": request.world_size,
            "batch_size": request.batch_size,
            "epoch": request.epoch,
            "offset": request.start_offset,
            "first_step": request.first_step,
            "stride": max(1, request.step_stride),
        }

    def start(self, pinned: str, label: str) -> None:
        self.dataset, self.label = pinned, label
        log_event(log, logging.INFO, "stream.start", **self._head(), **self.request)

    def sent(self, steps: int, rows: int, nbytes: int) -> None:
        self.steps += steps
        self.rows += rows
        self.bytes += nbytes

    def failed(self, outcome: str, error: str) -> None:
        self.outcome, self.error = outcome, error

    def end(self) -> None:
        extra = {"reason": self.reason} if self.reason else {}
        if self.error:
            extra["error"] = self.error
        log_event(
            log,
            logging.WARNING if self.outcome in _SERVER_FAULTS else logging.INFO,
            "stream.end",
            **self._head(),
            **{k: self.request[k] for k in ("rank", "world_size", "epoch", "offset") if k in self.request},
            steps=self.steps,
            rows=self.rows,
            bytes=self.bytes,
            duration_s=time.monotonic() - self.started_s,
            outcome=self.outcome,
            **extra,
        )

    def refused(self, error: str) -> None:
        log_event(log, logging.DEBUG, "stream.refused", **self._head(), error=error)

    def _head(self) -> dict[str, Any]:
        return {"stream_id": self.stream_id, "peer": self.peer, "dataset": self.dataset}
