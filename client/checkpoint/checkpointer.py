"""`Checkpointer`: save and load a job's model, optimizer and Loader state as one commit (DESIGN §13).

    ckpt = Checkpointer(endpoints, job="run-42")          # token= / tls= as the Loader's
    handle = ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict()}, loader=loader)
    handle.result(timeout=None)                          # committed (async by default)
    state = ckpt.load("latest", into={"model": model.state_dict(), "optim": opt.state_dict()}, loader=loader)
    opt.load_state_dict(state["optim"])                  # the model's tensors were loaded in place

**save** copies every tensor to host memory (pinned for CUDA tensors) and returns: that copy is the
step's whole stall. A background thread then hashes the bytes into content-addressed chunks
(checkpoint_format.CHUNK_BYTES), asks the server which it has, sends only the others (an
incremental save sends what changed), sends this rank's part record, and commits. Its memory is the
staged copy (one host copy of the state, kept for the next save to copy into, as DCP's async
staging does: fresh pages are most of a copy's cost); a **second save while one is uploading
waits** for it first (so at most one staged copy exists). With several ranks each rank saves its part
(same step, same `save_id`: broadcast by rank 0 when torch.distributed is initialized, else from the
launcher's run id), and the step is committed when the last part lands; `result()` waits for that.

**load** reads the manifest, then the chunks — verified by the server when it read them from storage,
as row groups are (a byte that differs from its name is DataLossError naming the checkpoint, the
tensor and the chunk), and again here with `verify=True` (end to end, at a sha256 per byte) —, writes them straight into the
matching tensors of `into` (in place) or into new CPU tensors, and positions the Loader with the
state its rank saved (rank 0's when this rank has none: a Loader's state resumes any world size).
The returned tree is the saved state with these tensors. A rank loads its own part when the world
size is the one that saved, else rank 0's: replicated state (DDP) loads anywhere; sharded state goes
through the DCP plugins, whose planner reshards.

A save whose error nobody asked for (its handle's `result()`) is never dropped silently: the next
save logs it, `close()` raises it (leaving a `with` block on an exception logs it instead).

`steps()` and `latest()` name committed steps only (a step whose manifest is damaged is skipped by
`latest`); `follow()` yields the newest committed step each time a newer one lands, skipping those
that landed between two looks, and rides out server restarts (RL rollout workers:
`for step in ckpt.follow(): ckpt.load(step, into=policy.state_dict())`).

A save that fails asks the server to remove the chunks it sent (those no committed step names), so
a full checkpoint root is not left full by a save that did not commit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shardstream.checkpoint_format import (
    CHUNK_BYTES,
    FORMAT,
    PART_KIND,
    check_job,
    check_step,
    decode_value,
    encode_value,
)
from shardstream.errors import InvalidArgumentError, NotFoundError

from ..credentials import ChannelSecurity, TlsOption
from ..launcher import resolve_rank_world
from ..spec import RetryPolicy
from . import checkpoint_metrics as metrics
from .chunks import ChunkStore
from .state_tree import Staged, restore, stage
from .transport import GET_STREAMS, CheckpointSession

__all__ = ["Checkpointer", "SaveHandle"]

log = logging.getLogger("shardstream.client.checkpoint")

FOLLOW_UNAVAILABLE_S = 300.0  # how long follow() keeps trying without reaching a server
FOLLOW_BACKOFF_S = (0.1, 5.0)  # follow()'s first and longest wait between tries when it reaches none
HASH_THREADS = GET_STREAMS  # sha256 releases the GIL: chunks are hashed (and fetched) this many at a time


class SaveHandle:
    """A save in progress: `result(timeout)` returns the committed step, or raises its error."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.bytes_sent = 0  # chunk bytes this save sent (those the server did not have)
        self.bytes_total = 0  # bytes of the staged state
        self.stall_s = 0.0  # how long save() held the caller (staging)
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._seen = False  # whether result() handed its error (if any) to someone

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise TimeoutError(f"checkpoint step {self.step} not committed within {timeout} s")
        self._seen = True
        if self._error is not None:
            raise self._error
        return self.step

    def _unseen_error(self) -> BaseException | None:
        """Its error, once, if it failed and nobody asked for its result."""
        if self._seen or self._error is None:
            return None
        self._seen = True
        return self._error

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()


class Checkpointer:
    def __init__(
        self,
        endpoints: str | Sequence[str],
        job: str,
        *,
        token: str | None = None,
        tls: TlsOption = None,
        rank: int | None = None,
        world_size: int | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.job = check_job(job)
        self.rank, self.world_size = resolve_rank_world(rank, world_size)
        if not 1 << 12 <= chunk_bytes <= 1 << 30:
            raise InvalidArgumentError(f"chunk_bytes must be from 4 KiB to 1 GiB, got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        self._session = CheckpointSession(endpoints, self.job, ChannelSecurity.from_options(tls, token))
        self._pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="checkpoint")
        self._chunks = ChunkStore(self._session, self.job, self._pool, chunk_bytes)
        self._saving: SaveHandle | None = None
        self._staging: dict[str, Any] = {}  # path -> the last save's staged tensor (reused once it is sent)
        self._save_lock = threading.Lock()
        self._closed = False
        metrics.export(self.job, self.rank)

    @property
    def server(self) -> str:
        """host:port of the data plane the calls go to now ("" before the first call)."""
        return self._session.target

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._close(raise_unseen=exc_type is None)  # leaving on an exception: logged, not masking it

    def close(self) -> None:
        """Wait for a save in progress, let the connection go, then raise that save's error if it
        failed and nobody asked its handle (as a Loader's close() does for its last commit)."""
        self._close(raise_unseen=True)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):  # as a Loader's: an unclosed one warns, then closes
            warnings.warn(
                f"unclosed {self!r}: call close() or use it as a context manager",
                ResourceWarning,
                stacklevel=1,
            )
            self._close(raise_unseen=False)

    def __repr__(self) -> str:
        return f"Checkpointer({self.job!r}, rank={self.rank}/{self.world_size})"

    def _close(self, *, raise_unseen: bool) -> None:
        if self._closed:
            return
        self._closed = True
        saving = self._saving
        error = None
        if saving is not None:
            saving._done.wait()
            error = saving._unseen_error()
        self._pool.shutdown(wait=True)
        self._session.close()
        if error is not None:
            if raise_unseen:
                raise error
            log.error("checkpoint step %d of %s was not committed: %s", saving.step, self.job, error)

    # --- save --------------------------------------------------------------------------------------
    def save(self, step: int, state: Any, loader: Any = None, *, blocking: bool = False) -> SaveHandle:
        check_step(step)
        if self._closed:
            raise InvalidArgumentError("save() on a closed Checkpointer")
        with self._save_lock:
            previous = self._saving
            if previous is not None:  # one staged copy at a time: a second save waits for the first
                previous._done.wait()
                error = previous._unseen_error()
                if error is not None:  # nobody asked its handle: said here, never silently dropped
                    log.error("checkpoint step %d of %s was not committed: %s", previous.step, self.job, error)
            t0 = time.perf_counter()
            handle = SaveHandle(step)
            loader_state = loader.state_dict() if loader is not None else None
            staged = stage(state, self._staging)
            objects = encode_value(staged.tree)  # a value that cannot be saved fails here, not later
            save_id = _save_id(step, self.world_size)
            handle.stall_s = time.perf_counter() - t0
            handle.bytes_total = staged.nbytes
            labels = (self.job, str(self.rank))
            metrics.SAVES.labels(*labels).inc()
            metrics.STALL.labels(*labels).observe(handle.stall_s)
            clock = getattr(loader, "step_clock", None)  # a Loader records it with its next commit
            if clock is not None:
                clock.checkpoint_stall(handle.stall_s)
            metrics.STATE.labels(*labels).inc(staged.nbytes)
            self._staging = {t.path: t for t in staged.tensors}
            self._saving = handle
            threading.Thread(
                target=self._upload,
                args=(handle, staged, objects, loader_state, save_id),
                name=f"checkpoint-save-{step}",
                daemon=True,
            ).start()
        if blocking:
            handle.result()
        return handle

    def _upload(self, handle: SaveHandle, staged: Staged, objects: Any, loader_state: Any, save_id: str) -> None:
        labels = (self.job, str(self.rank))
        t0 = time.perf_counter()
        sent: list[str] = []  # the chunks this save sent: removed again if it fails (a full root frees them)
        try:
            self._send(handle, staged, objects, loader_state, save_id, sent)
        except BaseException as exc:  # noqa: BLE001 — handed to the caller through the handle
            metrics.SAVE_FAILURES.labels(*labels).inc()
            if sent:
                self._chunks.abort(sent)
            handle._finish(exc)
        else:
            metrics.UPLOAD.labels(*labels).observe(time.perf_counter() - t0)
            handle._finish()
        finally:
            metrics.SENT.labels(*labels).inc(handle.bytes_sent)

    def _send(
        self, handle: SaveHandle, staged: Staged, objects: Any, loader_state: Any, save_id: str, sent: list[str]
    ) -> None:
        step = handle.step
        chunks, handle.bytes_sent, by_hash = self._chunks.store([t.data for t in staged.tensors], sent)
        tensors: dict[str, Any] = {
            str(i): {"path": t.path, "kind": t.kind, "dtype": t.dtype, "shape": t.shape, "nbytes": t.data.nbytes, "chunks": c}
            for i, (t, c) in enumerate(zip(staged.tensors, chunks, strict=True))
        }
        part = {
            "kind": PART_KIND,
            "format": FORMAT,
            "job": self.job,
            "step": step,
            "rank": self.rank,
            "world_size": self.world_size,
            "save_id": save_id,
            "created_s": time.time(),
            "tensors": tensors,
            "objects": objects,
            "loader": loader_state,
        }
        self._session.action("checkpoint.put-part", {"job": self.job, "step": step, "rank": self.rank, "part": part})
        handle.bytes_sent += self._chunks.commit(step, save_id, self.world_size, by_hash, sent)

    # --- what is there -----------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Committed steps, oldest first."""
        return self._steps()

    def latest(self) -> int | None:
        steps = self._steps()
        return steps[-1] if steps else None

    def manifest(self, step: int | str = "latest") -> dict[str, Any]:
        """The committed manifest of `step` ("latest": the newest)."""
        if step != "latest":
            check_step(step)
        return dict(self._session.action("checkpoint.manifest", {"job": self.job, "step": step}))

    def follow(
        self,
        *,
        poll_s: float = 0.2,
        start: int | None = None,
        timeout_s: float | None = None,
        unavailable_s: float = FOLLOW_UNAVAILABLE_S,
    ) -> Iterator[int]:
        """The newest committed step, each time a newer one than `start` (default: the latest when
        follow() is called) lands. It yields the newest only: when several commits land between two
        looks (every `poll_s`), the ones in between are skipped — a rollout worker wants the freshest
        policy, not a backlog; use steps() to see them all. Ends when `timeout_s` passes without a
        new one (None: never).

        It rides out servers restarting or moving (a Kubernetes Service, a rolling update): a look
        that fails as a stream would be resumed elsewhere (UNAVAILABLE, a cut connection, an
        overloaded server) is tried again by the transport (Fleet.call, one retry layer) — on the
        next endpoint, rediscovered — under a RetryPolicy of its own: a jittered backoff from
        FOLLOW_BACKOFF_S[0] up to FOLLOW_BACKOFF_S[1], for up to `unavailable_s` without an answer
        (where a save's calls give up after the Checkpointer's budget); then the last error is
        raised. `poll_s` is no retry: it is how often an answered look is made again."""
        retry = RetryPolicy(
            max_retries=0,  # the budget alone decides: `unavailable_s` without an answer
            budget_s=unavailable_s,
            backoff_base_s=FOLLOW_BACKOFF_S[0],
            backoff_max_s=FOLLOW_BACKOFF_S[1],
        )
        if start is None:
            start = max(self._steps(retry), default=None)
        return self._follow(-1 if start is None else start, poll_s, timeout_s, retry)

    def _steps(self, retry: RetryPolicy | None = None) -> list[int]:
        """Committed steps, oldest first; under `retry` when given (follow's), else the fleet's policy."""
        return list(self._session.action("checkpoint.steps", {"job": self.job}, retry)["steps"])

    def _follow(self, seen: int, poll_s: float, timeout_s: float | None, retry: RetryPolicy) -> Iterator[int]:
        last_new = time.monotonic()
        while True:
            new = [s for s in self._steps(retry) if s > seen]
            if new:
                seen = new[-1]
                last_new = time.monotonic()
                yield seen
                continue
            if timeout_s is not None and time.monotonic() - last_new > timeout_s:
                return
            time.sleep(poll_s)

    # --- torch.distributed.checkpoint ---------------------------------------------------------------
    def storage_writer(self, step: int, *, loader: Any = None) -> Any:
        """A DCP StorageWriter saving `step` of this job: `dcp.save(state, storage_writer=...)` on every
        rank (or `dcp.async_save`); committed when DCP's coordinator finishes (dcp.py)."""
        from .dcp import FleetStorageWriter  # torch, only for those who use DCP

        return FleetStorageWriter(self._chunks, step, loader)

    def storage_reader(self, step: int | str = "latest", *, loader: Any = None) -> Any:
        """A DCP StorageReader of `step`: `dcp.load(state, storage_reader=...)` with any world size."""
        from .dcp import FleetStorageReader

        reader = FleetStorageReader(self._chunks, step, loader)
        reader.read_metadata()  # a step that is not a DCP checkpoint fails here, in one line, not inside dcp.load
        return reader

    # --- load --------------------------------------------------------------------------------------
    def load(self, step: int | str = "latest", *, into: Any = None, loader: Any = None, verify: bool = False) -> Any:
        """Load `step` (or "latest"): tensors into `into`'s where it has them, the Loader's state into
        `loader`; the saved state tree, with its tensors."""
        if step != "latest":
            check_step(step)
        body = {"job": self.job, "step": step, "rank": self.rank, "world_size": self.world_size}
        manifest = self._session.action("checkpoint.manifest", body)  # with this rank's part only
        part = manifest["parts"][0]
        where = f"checkpoint {self.job}@{manifest['step']}"
        loaded = self._chunks.fetch(part, into, where, verify)
        metrics.LOADED.labels(self.job, str(self.rank)).inc(sum(t["nbytes"] for t in part["tensors"].values()))
        tree = decode_value(part["objects"])
        state = restore(tree, lambda name: loaded[name])
        if loader is not None:
            mine = part.get("loader")
            if mine is None:
                raise NotFoundError(f"{where} holds no Loader state (it was saved without loader=)")
            loader.load_state_dict(mine)
        return state



def _save_id(step: int, world_size: int) -> str:
    """The id every rank's part of this save carries: rank 0's, broadcast when torch.distributed runs;
    else the launcher's run (torchrun, SLURM) and step; else a fresh one for a single process, and the
    step alone for ranks that share nothing (then a rank that died mid-save and one of the restarted
    job may make one commit together: run such ranks under a launcher)."""
    import sys

    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])
    for run, restart in (("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"), ("SLURM_JOB_ID", "SLURM_RESTART_COUNT")):
        if os.environ.get(run):
            return f"{os.environ[run]}.{os.environ.get(restart, '0')}.{step}"
    return uuid.uuid4().hex if world_size == 1 else f"step.{step}"
