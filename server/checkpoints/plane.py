"""Checkpoints on the Flight data plane: the calls a Checkpointer makes (DESIGN §13).

    DoPut    descriptor = command {"op": "chunks", "job": J}; batches of (hash: string, data: binary)
             rows -> stored create-if-absent, each checked against its name; one PutResult at the
             end: {"stored": n, "present": m, "bytes": b}
    DoGet    ticket = CHUNK_TICKET_PREFIX + {"job": J, "hashes": [...]} -> one batch per chunk,
             (hash, data), verified and served from the server's row-group cache (so N ranks loading
             one checkpoint read storage once)
    DoAction "checkpoint.has" {"job", "hashes"} -> {"present": [...]}     (incremental saves)
             "checkpoint.put-part" {"job", "step", "rank", "part"} -> {}
             "checkpoint.commit" {"job", "step", "world_size", "save_id"} -> {"committed", "waiting_for", "missing"}
             "checkpoint.steps" {"job"} -> {"steps": [...]}                  (committed steps)
             "checkpoint.manifest" {"job", "step": int | "latest"[, "rank", "world_size"]} -> the
             manifest; with rank and world size, only the part that rank loads (its own when the
             world size is the saving one, else rank 0's; a Loader state filled in from another
             part when it has none), so a rank of a big job does not read every rank's records
    ListFlights criteria = a job name (empty: every job the caller may read) -> one FlightInfo per
             committed step, descriptor path [job, step]

Who may: a call is authenticated by its bearer token as DoGet's are (server/serving/auth.py); a principal writes
(and reads) the jobs its `checkpoints:` patterns match and only reads those of `checkpoints_read:`;
without --auth everyone may do everything. A job the caller may not read is PERMISSION_DENIED in
the same words whether it exists or not. Errors leave as the data plane's do (errors.py
`to_flight_error`), their texts redacted (server/serving/redact.py): no server path reaches a client.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
from prometheus_client import Counter

from shardstream.checkpoint_format import (
    CHUNK_TICKET_PREFIX,
    check_hash,
    check_job,
    check_step,
    manifest_key,
    signed_bytes,
)
from shardstream.errors import (
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ShardstreamError,
    excerpt,
    to_flight_error,
)

from ..read.cache import LRUCache
from ..serving.auth import Authenticator, Principal, has_token
from ..serving.grants import GRANT_HEADER, Grants
from ..serving.redact import client_message
from .store import CheckpointStore, dumps

__all__ = [
    "CHECKPOINT_MIDDLEWARE",
    "CHUNK_SCHEMA",
    "CHUNK_TICKET_PREFIX",
    "CheckpointCallFactory",
    "CheckpointPlane",
    "may_read",
    "may_write",
]

log = logging.getLogger("shardstream.server.checkpoints")

CHECKPOINT_MIDDLEWARE = "shardstream-checkpoints"
CHUNK_SCHEMA = pa.schema([("hash", pa.string()), ("data", pa.binary())])
MAX_HASHES_PER_CALL = 4096
MANIFESTS_KEPT = 64  # parsed manifests a server keeps (N ranks loading one step parse it once)

CHUNKS_WRITTEN = Counter("shardstream_checkpoint_chunks_written_total", "Checkpoint chunks stored (new)")
CHUNKS_PRESENT = Counter(
    "shardstream_checkpoint_chunks_deduplicated_total", "Checkpoint chunks sent that were stored already"
)
BYTES_WRITTEN = Counter("shardstream_checkpoint_written_bytes_total", "Checkpoint chunk bytes written to storage")
BYTES_READ = Counter(
    "shardstream_checkpoint_storage_read_bytes_total", "Checkpoint chunk bytes read from storage (cache misses)"
)
BYTES_SERVED = Counter("shardstream_checkpoint_served_bytes_total", "Checkpoint chunk bytes sent to clients")
COMMITS = Counter("shardstream_checkpoint_commits_total", "Checkpoints committed")


class _Headers(flight.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, headers: dict[str, list[Any]]) -> None:
        self.headers = headers

    def metadata(self) -> list[tuple[str, str]]:
        return [
            (k, v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
            for k, values in self.headers.items()
            for v in values
        ]


class CheckpointCallFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Keeps each call's headers (the bearer token) for the checkpoint calls."""

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[Any]]) -> _Headers:
        return _Headers(headers)


def _matches(job: str, patterns: tuple[str, ...] | None) -> bool:
    return patterns is None or any(fnmatch.fnmatchcase(job, p) for p in patterns)


def may_write(principal: Principal, job: str) -> bool:
    return _matches(job, getattr(principal, "checkpoints", None))


def may_read(principal: Principal, job: str) -> bool:
    read = getattr(principal, "checkpoints_read", None)
    return may_write(principal, job) or (read is not None and _matches(job, read))


class CheckpointPlane:
    """The checkpoint calls of one data plane over one store, its cache shared with Read streams."""

    def __init__(
        self,
        store: CheckpointStore,
        cache: LRUCache[pa.Table],
        auth: Authenticator,
        grants: Callable[[], Grants | None] = lambda: None,
    ) -> None:
        self.store = store
        self.cache = cache
        self.auth = auth
        self.grants = grants  # the data plane's, once it started (they vouch for certificate callers)
        self._manifests: OrderedDict[tuple[str, int], tuple[str, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    # --- who ---------------------------------------------------------------------------------------
    def _principal(self, context: flight.ServerCallContext, signed: bytes) -> Principal:
        """The caller: its token's principal; or, without a token, the certificate principal of the
        grant it sent (ListDatasets gave it), with the proof over `signed` (what the call asks:
        signed_bytes) that it holds the certificate's key — as a DoGet of a Read stream."""
        call = context.get_middleware(CHECKPOINT_MIDDLEWARE)
        metadata = call.metadata() if call is not None else []
        grants = self.grants()
        if call is not None and call.headers.get(GRANT_HEADER) and grants is not None and self.auth.enabled:
            if not has_token(metadata):
                return grants.principal(call.headers, signed, self.auth)
        return self.auth.authenticate(metadata, None)

    def _job(self, context: flight.ServerCallContext, job: object, signed: bytes, *, write: bool) -> str:
        name = check_job(job)
        principal = self._principal(context, signed)
        if not (may_write(principal, name) if write else may_read(principal, name)):
            raise PermissionDeniedError(
                f"checkpoint job {excerpt(name)} is not {'writable' if write else 'readable'} with the credentials "
                f"of principal {principal.name!r} (or does not exist): the server's --auth file lists the "
                "checkpoint jobs of each principal (checkpoints:, checkpoints_read:)"
            )
        return name

    def _fail(self, what: str, exc: BaseException) -> flight.FlightError:
        if not isinstance(exc, ShardstreamError):
            log.exception("checkpoint %s failed unexpectedly", what, exc_info=exc)
            exc = InternalError(client_message(exc, self.store.storage))
        elif exc.grpc_code.name == "DATA_LOSS":
            log.warning("checkpoint %s: %s", what, exc)
        return to_flight_error(exc.grpc_code, client_message(exc, self.store.storage))

    # --- DoPut: chunks -----------------------------------------------------------------------------
    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        try:
            command = _json(descriptor.command, "DoPut descriptor")
            if command.get("op") != "chunks":
                raise InvalidArgumentError(f"unknown checkpoint DoPut {excerpt(command.get('op'))}")
            job = self._job(context, command.get("job"), signed_bytes("put", descriptor.command), write=True)
            stored = present = nbytes = 0
            for chunk in reader:
                batch = chunk.data
                if batch is None:
                    continue
                if batch.schema.names != CHUNK_SCHEMA.names:
                    raise InvalidArgumentError(f"checkpoint chunks are (hash, data) rows, got {batch.schema.names}")
                hashes = batch.column(0).to_pylist()
                data = batch.column(1)
                for i, h in enumerate(hashes):
                    body = data[i].as_buffer()
                    if self.store.put_chunk(job, check_hash(h), memoryview(body)):
                        stored += 1
                        nbytes += body.size
                    else:
                        present += 1
            CHUNKS_WRITTEN.inc(stored)
            CHUNKS_PRESENT.inc(present)
            BYTES_WRITTEN.inc(nbytes)
            writer.write(pa.py_buffer(dumps({"stored": stored, "present": present, "bytes": nbytes})))
        except BaseException as exc:  # noqa: BLE001 — mapped to a Flight error
            raise self._fail("DoPut", exc) from None

    # --- DoGet: chunks -----------------------------------------------------------------------------
    def do_get(self, context: flight.ServerCallContext, ticket: bytes) -> flight.FlightDataStream:
        try:
            request = _json(ticket[len(CHUNK_TICKET_PREFIX) :], "DoGet ticket")
            job = self._job(context, request.get("job"), ticket, write=False)
            hashes = request.get("hashes")
            if not isinstance(hashes, list) or len(hashes) > MAX_HASHES_PER_CALL:
                raise InvalidArgumentError(f"a chunk DoGet names 1 to {MAX_HASHES_PER_CALL} chunks")
            names = [check_hash(h) for h in hashes]
            first = self._chunk(job, names[0]) if names else None
        except BaseException as exc:  # noqa: BLE001 — mapped to a Flight error
            raise self._fail("DoGet", exc) from None
        return flight.GeneratorStream(CHUNK_SCHEMA, self._chunks(job, names, first))

    def _chunk(self, job: str, h: str) -> pa.Table:
        def fetch() -> pa.Table:
            data = self.store.read_chunk(job, h)
            BYTES_READ.inc(len(data))
            return pa.table({"hash": pa.array([h]), "data": pa.array([data], pa.binary())})

        return self.cache.get(("checkpoint-chunk", job, h), fetch)

    def _chunks(self, job: str, names: list[str], first: pa.Table | None) -> Iterator[pa.RecordBatch]:
        try:
            for i, h in enumerate(names):
                table = first if i == 0 and first is not None else self._chunk(job, h)
                BYTES_SERVED.inc(table.nbytes)
                yield from table.to_batches()
        except GeneratorExit:
            raise
        except BaseException as exc:  # noqa: BLE001 — mapped to a Flight error
            raise self._fail("DoGet", exc) from None

    # --- DoAction ----------------------------------------------------------------------------------
    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[bytes]:
        try:
            raw = action.body.to_pybytes() if action.body is not None else b""
            result = self._action(context, action.type, _json(raw, action.type), signed_bytes(action.type, raw))
        except BaseException as exc:  # noqa: BLE001 — mapped to a Flight error
            raise self._fail(action.type, exc) from None
        return iter([dumps(result)])

    def _action(self, context: flight.ServerCallContext, kind: str, body: dict[str, Any], signed: bytes) -> Any:
        store = self.store
        if kind == "checkpoint.has":
            job = self._job(context, body.get("job"), signed, write=True)
            hashes = body.get("hashes")
            if not isinstance(hashes, list) or len(hashes) > MAX_HASHES_PER_CALL:
                raise InvalidArgumentError(f"checkpoint.has names at most {MAX_HASHES_PER_CALL} chunks")
            return {"present": store.has_chunks(job, hashes)}
        if kind == "checkpoint.put-part":
            job = self._job(context, body.get("job"), signed, write=True)
            rank = body.get("rank")
            if not isinstance(rank, int):
                raise InvalidArgumentError("checkpoint.put-part needs an int rank")
            store.put_part(job, check_step(body.get("step")), rank, body.get("part"))  # type: ignore[arg-type]
            return {}
        if kind == "checkpoint.commit":
            job = self._job(context, body.get("job"), signed, write=True)
            world = body.get("world_size")
            save_id = body.get("save_id")
            if not isinstance(world, int) or world < 1 or not isinstance(save_id, str):
                raise InvalidArgumentError("checkpoint.commit needs world_size >= 1 and a save_id")
            step = check_step(body.get("step"))
            out = store.commit(job, step, world, save_id)
            if out.pop("new", False):  # this call wrote the manifest (every rank asks: one line)
                manifest = out["manifest"]
                COMMITS.inc()
                log.info(
                    "checkpoint %s@%d committed: %d rank(s), %d bytes in %d chunks",
                    job, step, manifest["world_size"], manifest["bytes"], manifest["chunks"],
                )  # fmt: skip
            return {k: v for k, v in out.items() if k != "manifest"}
        if kind == "checkpoint.steps":
            return {"steps": store.steps(self._job(context, body.get("job"), signed, write=False))}
        if kind == "checkpoint.manifest":
            job = self._job(context, body.get("job"), signed, write=False)
            step = body.get("step")
            if step == "latest":
                latest = store.latest(job)
                if latest is None:
                    raise InvalidArgumentError(f"checkpoint job {job} has no committed checkpoint yet")
                step = latest
            manifest = self._manifest(job, check_step(step))
            rank, world = body.get("rank"), body.get("world_size")
            if isinstance(rank, int) and isinstance(world, int):
                return _for_rank(manifest, rank, world)
            return manifest
        raise InvalidArgumentError(f"unknown action {excerpt(kind)}")

    def _manifest(self, job: str, step: int) -> dict[str, Any]:
        """A committed manifest, parsed once per process while it is among the last MANIFESTS_KEPT
        asked for and its object is the same (one HEAD: a step removed by gc and saved again is
        another object)."""
        key = (job, step)
        try:
            etag = self.store.storage.head(manifest_key(job, step)).etag
        except NotFoundError:
            raise NotFoundError(f"checkpoint {job}@{step} does not exist (or is not committed)") from None
        with self._lock:
            hit = self._manifests.get(key)
            if hit is not None and hit[0] == etag:
                self._manifests.move_to_end(key)
                return hit[1]
        manifest = self.store.manifest(job, step)
        with self._lock:
            self._manifests[key] = (etag, manifest)
            while len(self._manifests) > MANIFESTS_KEPT:
                self._manifests.popitem(last=False)
        return manifest

    # --- ListFlights -------------------------------------------------------------------------------
    def list_flights(self, context: flight.ServerCallContext, criteria: bytes) -> Iterator[flight.FlightInfo]:
        try:
            signed = signed_bytes("list", criteria)
            principal = self._principal(context, signed)
            if criteria:
                jobs = [self._job(context, criteria.decode("utf-8", "replace"), signed, write=False)]
            else:
                jobs = [j for j in self.store.jobs() if may_read(principal, j)]
            infos = []
            for job in jobs:
                for step in self.store.steps(job):
                    descriptor = flight.FlightDescriptor.for_path(job, str(step))
                    infos.append(flight.FlightInfo(pa.schema([]), descriptor, [], -1, -1))
        except BaseException as exc:  # noqa: BLE001 — mapped to a Flight error
            raise self._fail("ListFlights", exc) from None
        return iter(infos)


def _for_rank(manifest: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    parts = manifest["parts"]
    same = manifest["world_size"] == world_size and 0 <= rank < len(parts)
    part = dict(parts[rank] if same else parts[0])
    if part.get("loader") is None:
        part["loader"] = next((p["loader"] for p in parts if p.get("loader") is not None), None)
    return {**manifest, "parts": [part]}


def _json(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        value = None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"the checkpoint {what} must be a JSON object")
    return value
