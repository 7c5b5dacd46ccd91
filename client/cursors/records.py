"""Cursor records: one rank's Loader state at one checkpoint step of a job (pure, no I/O).

A record is small versioned JSON:

    {"kind": "shardstream.Cursor", "format": 1, "job": "run-42", "rank": 3, "step": 1200,
     "time": 1764112345.2, "run": "host:pid:token", "state": {<Loader.state_dict()>}}

Fields added to format 1 later are optional and read with a default, so records written before
them stay readable and older clients ignore them: "run" (the process that wrote the record,
fence.py) was added with fencing; "timings" (where the rank's step time went since its previous
commit: data wait, balanced-step cost ratio, checkpoint stall — step_timings.py) with the job page's
step-time table. A change that older clients could misread bumps the format.

The state inside is global (dataset fingerprint, seed, shuffle, epoch, offset, ...): every rank
of a job writes the same one at the same step, so any of them resumes any new world size.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardstream.errors import CorruptCursorError, InvalidArgumentError

from ..loader_state import LoaderState
from ..step_timings import StepTimings

__all__ = ["CURSOR_FORMAT", "CursorRecord", "Migration", "validate_job"]

CURSOR_FORMAT = 1
_KIND = "shardstream.Cursor"
_JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


def validate_job(job: str) -> str:
    if not isinstance(job, str) or not _JOB_RE.match(job):
        raise InvalidArgumentError(
            f"invalid job name {job!r}: letters, digits, '.', '_', ':' or '-', at most 128, not starting with punctuation"
        )
    return job


@dataclass(frozen=True)
class CursorRecord:
    job: str
    rank: int
    step: int
    state: LoaderState
    time: float = 0.0
    run: str = ""  # the writing process's run token ("" in records written before runs existed)
    timings: StepTimings | None = None  # since the rank's previous commit (None in older records)

    @property
    def world_size(self) -> int:
        return self.state.world_size

    @property
    def key(self) -> str:
        """Names the cursor itself: the ranks of one run at one step share it, other runs don't."""
        s = self.state
        text = f"{s.world_size}|{s.fingerprint}|{s.seed}|{s.shuffle}|{s.epoch}|{s.offset}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_bytes(self) -> bytes:
        d = {
            "kind": _KIND,
            "format": CURSOR_FORMAT,
            "job": self.job,
            "rank": self.rank,
            "step": self.step,
            "time": self.time or time.time(),
            "state": self.state.to_dict(),
        }
        if self.run:
            d["run"] = self.run
        if self.timings is not None:
            d["timings"] = self.timings.to_dict()
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes | str, *, where: str) -> CursorRecord:
        """Parse a stored record; CorruptCursorError naming `where` and what is wrong."""
        try:
            d = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptCursorError(f"{where}: not a cursor record (truncated or garbage: {exc})") from None
        if not isinstance(d, Mapping) or d.get("kind") != _KIND:
            raise CorruptCursorError(f"{where}: not a shardstream cursor record")
        if d.get("format") != CURSOR_FORMAT:
            raise CorruptCursorError(
                f"{where}: cursor format {d.get('format')!r}, this client reads {CURSOR_FORMAT}"
            )
        try:
            rec = cls(
                job=str(d["job"]),
                rank=_int(d, "rank"),
                step=_int(d, "step"),
                state=LoaderState.from_dict(d["state"]),
                time=float(d.get("time", 0.0)),
                run=str(d.get("run", "")),
                timings=_timings(d.get("timings")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            detail = exc.args[0] if exc.args else exc
            raise CorruptCursorError(f"{where}: malformed cursor record ({detail})") from None
        return rec

    def describe(self) -> dict[str, Any]:
        s = self.state
        return {
            "rank": self.rank,
            "world_size": s.world_size,
            "batch_size": s.batch_size,
            "epoch": s.epoch,
            "offset": s.offset,
            "steps": s.steps,
            "dataset": s.dataset,
            "time": self.time,
            "run": self.run,
            **({"timings": self.timings.to_dict()} if self.timings is not None else {}),
            **({"schedule": dict(s.schedule)} if s.schedule else {}),
        }


def _timings(value: Any) -> StepTimings | None:
    """The record's timings; None when absent or malformed: they explain the step time, and a resume
    never fails for them."""
    if value is None:
        return None
    try:
        return StepTimings.from_dict(value)
    except (TypeError, ValueError):
        return None


def _int(d: Mapping[str, Any], key: str) -> int:
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key!r} must be an integer >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class Migration:
    """A job's explicit move to another version of its dataset, effective at an epoch boundary."""

    job: str
    from_dataset: str
    from_fingerprint: str
    to_dataset: str
    to_fingerprint: str
    at_epoch: int

    def to_bytes(self) -> bytes:
        d = {"kind": "shardstream.Migration", "format": CURSOR_FORMAT, **self.__dict__, "time": time.time()}
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str) -> Migration:
        try:
            d = json.loads(data)
            if d.get("kind") != "shardstream.Migration" or d.get("format") != CURSOR_FORMAT:
                raise ValueError("not a migration record of this format")
            return cls(
                job=str(d["job"]),
                from_dataset=str(d["from_dataset"]),
                from_fingerprint=str(d["from_fingerprint"]),
                to_dataset=str(d["to_dataset"]),
                to_fingerprint=str(d["to_fingerprint"]),
                at_epoch=_int(d, "at_epoch"),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptCursorError(f"{where}: malformed migration record ({exc})") from None
