"""What one writer may ask of a server's checkpoint calls (DESIGN §10 admission, for checkpoints).

A shared fleet serves many jobs' checkpoints from one root: without bounds one writer can fill the
server's memory or the root. Each bound is a `serve` option with a safe default:

    max_record_bytes     a DoAction body, a DoPut descriptor or a DoGet ticket: bigger is
                         INVALID_ARGUMENT before it is parsed (a part record of 1M tensors is ~200 MB
                         of JSON; 64 MiB holds ~300k tensors' records)
    max_json_depth       nesting of the JSON in them (a put-part's part record, the previous release's
                         JSON commands; a state tree is ~10 deep)
    max_chunk_bytes      one chunk of a DoPut (the client's chunks are 8 MiB by default; 64 with room)
    inflight_job_bytes   chunk bytes a server holds for one job at once, over all its DoPuts, and
    inflight_principal_bytes  for one principal: a DoPut over them waits for room (its client is
                         held back by gRPC's flow control) up to `inflight_wait_s`, then
                         RESOURCE_EXHAUSTED with a retry hint
    job_quota_bytes      optional: bytes a job may keep under the root (its chunks, parts and
                         manifests, as this process counts them: listed at most every
                         QUOTA_REFRESH_S, plus what it stored since); over it, RESOURCE_EXHAUSTED
                         naming the job and `checkpoint gc`

A DoPut names the chunks it sends in its descriptor, so it cannot run on without end, and the proof
of a caller known by its certificate signs that list: a replayed DoPut can only send the same bytes
again (stored once: content addressed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from shardstream.errors import InvalidArgumentError, ResourceExhaustedError

__all__ = ["DEFAULT_LIMITS", "CheckpointLimits", "InFlight", "Quota"]

QUOTA_REFRESH_S = 60.0


@dataclass(frozen=True)
class CheckpointLimits:
    max_record_bytes: int = 64 << 20
    max_json_depth: int = 64
    max_chunk_bytes: int = 64 << 20
    inflight_job_bytes: int = 512 << 20
    inflight_principal_bytes: int = 1 << 30
    inflight_wait_s: float = 60.0
    job_quota_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_record_bytes", "max_json_depth", "max_chunk_bytes", "inflight_job_bytes", "inflight_principal_bytes"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"checkpoint limit {name} must be positive, got {getattr(self, name)}")
        if self.inflight_job_bytes < self.max_chunk_bytes or self.inflight_principal_bytes < self.max_chunk_bytes:
            raise InvalidArgumentError(
                "--checkpoint-inflight-mib must hold one chunk at least (--checkpoint-max-chunk-mib)"
            )
        if self.job_quota_bytes is not None and self.job_quota_bytes < 1:
            raise InvalidArgumentError(f"--checkpoint-job-quota-gib must be positive, got {self.job_quota_bytes} bytes")


DEFAULT_LIMITS = CheckpointLimits()


class InFlight:
    """Bytes held at once per job and per principal, each under its bound; a taker over the bound
    waits for room (bounded), then is RESOURCE_EXHAUSTED."""

    def __init__(self, limits: CheckpointLimits) -> None:
        self.limits = limits
        self._held: dict[tuple[str, str], int] = {}
        self._cond = threading.Condition()

    @contextmanager
    def hold(self, job: str, principal: str, nbytes: int) -> Iterator[None]:
        keys = ((("job", job), self.limits.inflight_job_bytes), (("principal", principal), self.limits.inflight_principal_bytes))
        deadline = time.monotonic() + self.limits.inflight_wait_s
        with self._cond:
            while any(self._held.get(k, 0) + nbytes > bound and self._held.get(k, 0) > 0 for k, bound in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ResourceExhaustedError(
                        f"checkpoint job {job}: this server holds {self.limits.inflight_job_bytes >> 20} MiB of its "
                        "uploads (or its principal's) already (serve --checkpoint-inflight-mib): retry later",
                        retry_after_s=1.0,
                    )
                self._cond.wait(left)
            for k, _ in keys:
                self._held[k] = self._held.get(k, 0) + nbytes
        try:
            yield
        finally:
            with self._cond:
                for k, _ in keys:
                    left_held = self._held[k] - nbytes
                    if left_held:
                        self._held[k] = left_held
                    else:
                        del self._held[k]
                self._cond.notify_all()


class Quota:
    """Bytes each job keeps under the root as this process counts them (see the module docstring)."""

    def __init__(self, limit_bytes: int | None, usage: Callable[[str], int]) -> None:
        self.limit_bytes = limit_bytes
        self._usage = usage  # job -> bytes under the root (a listing)
        self._known: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def check(self, job: str, nbytes: int) -> None:
        if self.limit_bytes is None:
            return
        now = time.monotonic()
        with self._lock:
            known = self._known.get(job)
        if known is None or now - known[0] > QUOTA_REFRESH_S:
            known = (now, self._usage(job))
            with self._lock:
                self._known[job] = known
        if known[1] + nbytes > self.limit_bytes:
            raise ResourceExhaustedError(
                f"checkpoint job {job} is over its quota of {self.limit_bytes / (1 << 30):.3g} GiB on this fleet "
                "(serve --checkpoint-job-quota-gib): remove old steps with `shardstream checkpoint gc --job "
                f"{job} --keep N`"
            )

    def add(self, job: str, nbytes: int) -> None:
        if self.limit_bytes is None:
            return
        with self._lock:
            t, used = self._known.get(job, (time.monotonic(), 0))
            self._known[job] = (t, used + nbytes)
