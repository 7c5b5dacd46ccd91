"""The audit log: one structured line per Read stream, and per refused call, on `shardstream.audit`.

Each line says who read what and how it ended:

    audit method=Read principal=team-a dataset=web@3 rank=0 world=2 epoch=0 offset=0 first_step=4
          bytes=1048576 messages=3 outcome=OK peer=ipv4:10.0.0.7:51234 duration_s=0.412

`dataset` is the version the stream read once planned (a mixture: its sources joined with '+'), else
the reference as the request gave it; `outcome`
is OK, the status code the stream ended with, or GONE for a client that went away mid-stream. The
record is an event as the server's other structured lines are (`record.event` = "audit", the fields
in `record.fields`), so `--log-format json` writes them as the keys of one object. Its own logger
name, so an operator can route it (a file, a SIEM) or silence it apart from the server's other
lines. Values a caller chose are cut to EXCERPT_CHARS; a token never appears.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from shardstream.errors import EXCERPT_CHARS
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["AUDIT_LOGGER", "StreamAudit", "audit_call"]

AUDIT_LOGGER = "shardstream.audit"
log = logging.getLogger(AUDIT_LOGGER)


def _cut(text: str, limit: int = EXCERPT_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)})"


def _text(value: Any) -> str:
    text = f"{value:.3f}" if isinstance(value, float) else str(value)
    return json.dumps(text) if (not text or any(c.isspace() or c in '"=' for c in text)) else text


def _emit(fields: dict[str, Any]) -> None:
    if log.isEnabledFor(logging.INFO):
        text = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        log.info("audit %s", text, extra={"event": "audit", "fields": fields})


def _dataset(request: pb.ReadRequest | None) -> str:
    if request is None:
        return "-"
    if request.mixture:
        return _cut("+".join(s.dataset for s in request.mixture), 200)
    return _cut(request.dataset)


@dataclass
class StreamAudit:
    """One Read stream's audit line, filled in as it goes and written once by `done`."""

    peer: str
    request: pb.ReadRequest | None = None
    principal: str = "-"
    dataset: str | None = None  # the versions read, once planned
    bytes: int = 0
    messages: int = 0
    started: float = field(default_factory=time.monotonic)

    def planned(self, refs: list[str]) -> None:
        self.dataset = "+".join(refs)

    def sent(self, nbytes: int) -> None:
        self.bytes += nbytes
        self.messages += 1

    def done(self, outcome: str) -> None:
        r = self.request
        _emit(
            {
                "method": "Read",
                "principal": _cut(self.principal),
                "dataset": _cut(self.dataset, 200) if self.dataset else _dataset(r),
                "rank": r.rank if r is not None else "-",
                "world": r.world_size if r is not None else "-",
                "epoch": r.epoch if r is not None else "-",
                "offset": r.start_offset if r is not None else "-",
                "first_step": r.first_step if r is not None else "-",
                "bytes": self.bytes,
                "messages": self.messages,
                "outcome": outcome,
                "peer": self.peer,
                "duration_s": time.monotonic() - self.started,
            }
        )


def audit_call(method: str, principal: str, dataset: str, outcome: str, peer: str) -> None:
    """The line of a control-plane call that was refused (UNAUTHENTICATED, PERMISSION_DENIED)."""
    _emit(
        {
            "method": method,
            "principal": _cut(principal),
            "dataset": _cut(dataset) if dataset else "-",
            "outcome": outcome,
            "peer": peer,
        }
    )
