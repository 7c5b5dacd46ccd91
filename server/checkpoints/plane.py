"""Checkpoints on the Flight data plane: the calls a Checkpointer makes (DESIGN §13).

Each call's command is a `CheckpointCommand` (protos/shardstream/v1, shardstream/checkpoint_commands.py)
holding the op of that call; below, its fields as the dict the handlers read. A command that starts
with "{" (no CheckpointCommand does) is the previous release's JSON object of the same fields, still
accepted (the DoPut's with "op": "chunks"). Answers are JSON.

    DoPut    descriptor = command put_chunks {job, hashes: the chunks it sends}; batches of
             CHUNK_SCHEMA (hash: string, data: binary) rows, each a chunk the descriptor names ->
             stored create-if-absent, each checked against its name; one PutResult at the end:
             {"stored": n, "present": m, "bytes": b}. A DoPut that fails removes what it stored.
    DoGet    ticket = CHUNK_TICKET_PREFIX + command get_chunks {job, hashes} -> one batch per chunk,
             (hash, data), verified and served from the server's row-group cache (so N ranks loading
             one checkpoint read storage once)
    DoAction "checkpoint.has" has {job, hashes} -> {"present": [...]}     (incremental saves)
             "checkpoint.put-part" put_part {job, step, rank, part_json} -> {}
             "checkpoint.commit" commit {job, step, world_size, save_id} -> {"committed",
                                 "waiting_for" (the first 64), "waiting" (how many), "missing"}
             "checkpoint.abort" abort {job, hashes} -> {"freed": bytes}  (a failed save's chunks, those
                                 no committed step names, removed: a full root frees what it took)
             "checkpoint.steps" steps {job} -> {"steps": [...]}                  (committed steps)
             "checkpoint.manifest" manifest {job, step | latest[, rank, world_size]} -> the
             manifest; with rank and world size, only the part that rank loads (its own when the
             world size is the saving one, else rank 0's; a Loader state filled in from another
             part when it has none), so a rank of a big job does not read every rank's records
             (a DoAction whose command holds another op than its type names is INVALID_ARGUMENT)
    ListFlights criteria = a job name (empty: every job the caller may read) -> one FlightInfo per
             committed step, descriptor path [job, step]

Limits (limits.py, `serve --checkpoint-*`): every call is authenticated from its headers before
its body is read or parsed (a certificate caller's proof covers the body as sent: it is hashed, not
parsed, and only once its size is within bounds); a command, proto or JSON, is parsed within a size
bound (JSON, and a part's part_json, within a depth bound too; a proto field this version does not
define is INVALID_ARGUMENT); chunk sizes, bytes in flight per job and principal, and an optional
quota per job bound the writers.

The data plane hands each call here with its `Call` (the one middleware of every Flight method: its
headers, and its grpc_server_* metrics with the exact code of the error that ended it).

Who may: a call is authenticated by its bearer token as DoGet's are (server/policy/auth.py); a principal writes
(and reads) the jobs its `checkpoints:` patterns match and only reads those of `checkpoints_read:`;
without --auth everyone may do everything. A job the caller may not read is PERMISSION_DENIED in
the same words whether it exists or not. Errors leave as the data plane's do (errors.py
`to_flight_error`), their texts redacted (server/policy/redact.py): no server path reaches a client.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.flight as flight
from prometheus_client import Counter

from shardstream.checkpoint_commands import decode_command, is_json_command
from shardstream.checkpoint_format import (
    CHUNK_SCHEMA,
    CHUNK_TICKET_PREFIX,
    check_hash,
    check_job,
    check_step,
    manifest_key,
    signed_bytes,
)
from shardstream.errors import (
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ShardstreamError,
    excerpt,
    to_flight_error,
)

from ..policy.auth import Authenticator, Principal
from ..policy.grants import Grants, caller_principal
from ..policy.redact import client_error
from ..read.cache import LRUCache
from .limits import DEFAULT_LIMITS, CheckpointLimits, InFlight, Quota
from .store import CheckpointStore, dumps

__all__ = [
    "CHUNK_SCHEMA",
    "CHUNK_TICKET_PREFIX",
    "CheckpointPlane",
    "Call",
]

log = logging.getLogger("shardstream.server.checkpoints")

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
ABORTED = Counter(
    "shardstream_checkpoint_aborted_bytes_total", "Chunk bytes removed because the save that stored them failed"
)


class Call(Protocol):
    """What a handler knows of a call: its headers (the data plane's one middleware for every method)."""

    headers: dict[str, list[Any]]

    def metadata(self) -> list[tuple[str, str]]: ...


class CheckpointPlane:
    """The checkpoint calls of one data plane over one store, its cache shared with Read streams."""

    def __init__(
        self,
        store: CheckpointStore,
        cache: LRUCache[pa.Table],
        auth: Authenticator,
        grants: Callable[[], Grants | None] = lambda: None,
        limits: CheckpointLimits = DEFAULT_LIMITS,
    ) -> None:
        self.store = store
        self.cache = cache
        self.auth = auth
        self.grants = grants  # the data plane's, once it started (they vouch for certificate callers)
        self.limits = limits
        self.inflight = InFlight(limits)
        self.quota = Quota(limits.job_quota_bytes, self._usage)
        self._manifests: OrderedDict[tuple[str, int], tuple[str, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    # --- who ---------------------------------------------------------------------------------------
    def _caller(self, call: Call, body: Any, what: str, sign: Callable[[bytes], bytes]) -> Principal:
        """The caller, from the call's headers: its token's principal; or, without a token, the
        certificate principal of the grant it sent (ListDatasets gave it), with the proof over
        `sign(body)` (what the call asks: signed_bytes) that it holds the certificate's key — as a
        DoGet of a Read stream. A caller without credentials is refused before its body is looked
        at; then the body's size is checked (max_record_bytes), before the proof hashes it or
        anything parses it. `body` is bytes or a pyarrow Buffer."""

        def signed() -> bytes:  # a grant's proof is over the body: its size checked first
            self._record(body, what)
            return sign(body.to_pybytes() if isinstance(body, pa.Buffer) else body)

        principal = caller_principal(self.auth, self.grants(), call.headers, call.metadata(), signed)
        self._record(body, what)
        return principal

    def _check_job(self, principal: Principal, job: object, *, write: bool) -> str:
        name = check_job(job)
        if not (principal.may_write_checkpoints(name) if write else principal.may_read_checkpoints(name)):
            raise PermissionDeniedError(
                f"checkpoint job {excerpt(name)} is not {'writable' if write else 'readable'} with the credentials "
                f"of principal {principal.name!r} (or does not exist): the server's --auth file lists the "
                "checkpoint jobs of each principal (checkpoints:, checkpoints_read:)"
            )
        return name

    def _record(self, raw: Any, what: str) -> None:
        """A body (bytes or a pyarrow Buffer) within max_record_bytes, before anything reads it."""
        size = raw.size if isinstance(raw, pa.Buffer) else len(raw)
        if size > self.limits.max_record_bytes:
            raise InvalidArgumentError(
                f"the checkpoint {what} is {size} bytes, over this server's {self.limits.max_record_bytes} "
                "(serve --checkpoint-max-record-mib)"
            )

    def _json(self, raw: bytes, what: str) -> dict[str, Any]:
        return parse_record(raw, what, self.limits.max_json_depth)

    def _command(self, raw: bytes, kind: str, what: str) -> dict[str, Any]:
        """A call's command (its size already bounded): a CheckpointCommand, or the previous
        release's JSON object (it starts with "{", no CheckpointCommand does), as one dict."""
        if is_json_command(raw):
            return self._json(raw, what)
        return decode_command(raw, kind, what, lambda part: self._json(part, f"{what} part"))

    def _fail(self, what: str, exc: BaseException) -> flight.FlightError:
        if isinstance(exc, ShardstreamError) and exc.grpc_code.name == "DATA_LOSS":
            log.warning("checkpoint %s: %s", what, exc)
        exc, details = client_error(exc, self.store.storage, log, f"checkpoint {what}")
        return to_flight_error(exc.grpc_code, details)

    # --- DoPut: chunks -----------------------------------------------------------------------------
    def do_put(
        self,
        call: Call,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        stored: list[str] = []
        job = ""
        try:
            raw = descriptor.command
            principal = self._caller(call, raw, "DoPut descriptor", lambda b: signed_bytes("put", b))
            command = self._command(raw, "chunks.put", "DoPut descriptor")
            if command.get("op") != "chunks":
                raise InvalidArgumentError(f"unknown checkpoint DoPut {excerpt(command.get('op'))}")
            job = self._check_job(principal, command.get("job"), write=True)
            names = command.get("hashes")
            if not isinstance(names, list) or not 1 <= len(names) <= MAX_HASHES_PER_CALL:
                raise InvalidArgumentError(
                    f"a checkpoint DoPut's descriptor names the 1 to {MAX_HASHES_PER_CALL} chunks it sends (\"hashes\")"
                )
            expected = {check_hash(h) for h in names}
            present = nbytes = 0
            for chunk in reader:
                batch = chunk.data
                if batch is None:
                    continue
                _check_chunk_batch(batch)
                data = batch.column(1)
                for i, h in enumerate(batch.column(0).to_pylist()):
                    if h not in expected:
                        raise InvalidArgumentError(
                            f"checkpoint job {job}: the DoPut sent chunk {excerpt(h)} its descriptor does not name "
                            "(or sent it twice)"
                        )
                    expected.discard(h)
                    body = data[i].as_buffer()
                    if body.size > self.limits.max_chunk_bytes:
                        raise InvalidArgumentError(
                            f"checkpoint job {job}: a chunk of {body.size} bytes is over this server's "
                            f"{self.limits.max_chunk_bytes} (serve --checkpoint-max-chunk-mib; Checkpointer(chunk_bytes=))"
                        )
                    with self.inflight.hold(job, principal.name, body.size):
                        self.quota.check(job, body.size)
                        if self.store.put_chunk(job, h, memoryview(body)):
                            stored.append(h)
                            nbytes += body.size
                            self.quota.add(job, body.size)
                        else:
                            present += 1
                    del body
            CHUNKS_WRITTEN.inc(len(stored))
            CHUNKS_PRESENT.inc(present)
            BYTES_WRITTEN.inc(nbytes)
            writer.write(pa.py_buffer(dumps({"stored": len(stored), "present": present, "bytes": nbytes})))
        except BaseException as exc:  # noqa: BLE001 — mapped to a Flight error
            if stored:  # a failed DoPut leaves nothing it stored (the client's next try sends them again)
                self._forget(job, stored)
            raise self._fail("DoPut", exc) from None

    def _forget(self, job: str, hashes: list[str]) -> int:
        try:
            freed = self.store.forget(job, hashes)
        except InvalidArgumentError:  # a name that is none (an abort's): the caller's error
            raise
        except BaseException as exc:  # noqa: BLE001 — the call's own error is the one to report
            log.warning("checkpoint job %s: removing a failed save's %d chunk(s) failed: %s", job, len(hashes), exc)
            return 0
        ABORTED.inc(freed)
        self.quota.add(job, -freed)
        return freed

    def _usage(self, job: str) -> int:
        return sum(info.size for _, info in self.store.storage.list_info(f"{check_job(job)}/"))

    # --- DoGet: chunks -----------------------------------------------------------------------------
    def do_get(self, call: Call, ticket: bytes) -> flight.FlightDataStream:
        try:
            principal = self._caller(call, ticket, "DoGet ticket", lambda b: b)
            request = self._command(ticket[len(CHUNK_TICKET_PREFIX) :], "chunks.get", "DoGet ticket")
            job = self._check_job(principal, request.get("job"), write=False)
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
            return pa.table([pa.array([h]), pa.array([data], pa.binary())], schema=CHUNK_SCHEMA)

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
    def do_action(self, call: Call, action: flight.Action) -> Iterator[bytes]:
        kind = action.type
        try:
            buffer = action.body if action.body is not None else pa.py_buffer(b"")
            principal = self._caller(call, buffer, kind, lambda b: signed_bytes(kind, b))
            result = self._action(principal, kind, self._command(buffer.to_pybytes(), kind, kind))
        except BaseException as exc:  # noqa: BLE001 — mapped to a Flight error
            raise self._fail(kind, exc) from None
        return iter([dumps(result)])

    def _action(self, principal: Principal, kind: str, body: dict[str, Any]) -> Any:
        store = self.store
        if kind == "checkpoint.has":
            job = self._check_job(principal, body.get("job"), write=True)
            hashes = body.get("hashes")
            if not isinstance(hashes, list) or len(hashes) > MAX_HASHES_PER_CALL:
                raise InvalidArgumentError(f"checkpoint.has names at most {MAX_HASHES_PER_CALL} chunks")
            return {"present": store.has_chunks(job, hashes)}
        # step, rank, world_size and save_id are the store's to check (store.py: the domain boundary)
        if kind == "checkpoint.put-part":
            job = self._check_job(principal, body.get("job"), write=True)
            store.put_part(job, body.get("step"), body.get("rank"), body.get("part"))  # type: ignore[arg-type]
            return {}
        if kind == "checkpoint.commit":
            job = self._check_job(principal, body.get("job"), write=True)
            out = store.commit(job, body.get("step"), body.get("world_size"), body.get("save_id"))  # type: ignore[arg-type]
            if out.pop("new", False):  # this call wrote the manifest (every rank asks: one line)
                manifest = out["manifest"]
                COMMITS.inc()
                log.info(
                    "checkpoint %s@%d committed: %d rank(s), %d bytes in %d chunks",
                    job, manifest["step"], manifest["world_size"], manifest["bytes"], manifest["chunks"],
                )  # fmt: skip
            return {k: v for k, v in out.items() if k != "manifest"}
        if kind == "checkpoint.abort":
            job = self._check_job(principal, body.get("job"), write=True)
            hashes = body.get("hashes")
            if not isinstance(hashes, list) or len(hashes) > MAX_HASHES_PER_CALL:
                raise InvalidArgumentError(f"checkpoint.abort names at most {MAX_HASHES_PER_CALL} chunks")
            return {"freed": self._forget(job, hashes)}  # the store checks the names
        if kind == "checkpoint.steps":
            return {"steps": self._steps(self._check_job(principal, body.get("job"), write=False))}
        if kind == "checkpoint.manifest":
            job = self._check_job(principal, body.get("job"), write=False)
            step = body.get("step")
            manifest = self._latest(job) if step == "latest" else self._manifest(job, check_step(step))
            rank, world = body.get("rank"), body.get("world_size")
            if _is_int(rank) and _is_int(world):
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

    def _newest(self, job: str) -> tuple[list[int], dict[str, Any] | None]:
        """(committed steps oldest first without the damaged ones, the newest manifest that reads).
        The newest is read (one HEAD once it is cached) and so is each damaged one after an intact
        one, so `latest` is the newest step that loads; older damaged ones drop out once this
        process has read them (the store logs and counts each once)."""
        steps = self.store.steps(job)
        skipped = self.store.known_damaged(job)
        newest = None
        for step in reversed(steps):
            if step in skipped:
                continue
            try:
                newest = self._manifest(job, step)
            except (DataLossError, NotFoundError):
                skipped.add(step)
                continue
            break
        return [s for s in steps if s not in skipped], newest

    def _steps(self, job: str) -> list[int]:
        return self._newest(job)[0]

    def _latest(self, job: str) -> dict[str, Any]:
        """The newest committed manifest that reads: a restarting job loads the step before a damaged one."""
        newest = self._newest(job)[1]
        if newest is None:
            raise NotFoundError(f"checkpoint job {job} has no committed checkpoint yet")
        return newest

    # --- ListFlights -------------------------------------------------------------------------------
    def list_flights(self, call: Call, criteria: bytes) -> Iterator[flight.FlightInfo]:
        try:
            principal = self._caller(call, criteria, "ListFlights criteria", lambda b: signed_bytes("list", b))
            if criteria:
                jobs = [self._check_job(principal, criteria.decode("utf-8", "replace"), write=False)]
            else:
                jobs = [j for j in self.store.jobs() if principal.may_read_checkpoints(j)]
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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_record(raw: bytes, what: str, max_depth: int) -> dict[str, Any]:
    """A JSON object nested at most `max_depth` deep: INVALID_ARGUMENT otherwise (never a
    RecursionError: the parser's own guard is caught, and the depth checked without recursion)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise InvalidArgumentError(f"the checkpoint {what} nests deeper than {max_depth}") from None
    except (ValueError, UnicodeDecodeError):
        value = None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"the checkpoint {what} must be a JSON object")
    level: list[Any] = [value]
    for _ in range(max_depth):
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, (dict, list))]
        if not level:
            return value
    raise InvalidArgumentError(f"the checkpoint {what} nests deeper than {max_depth}")


def _check_chunk_batch(batch: pa.RecordBatch) -> None:
    if not batch.schema.equals(CHUNK_SCHEMA) or batch.column(0).null_count or batch.column(1).null_count:
        raise InvalidArgumentError(
            f"checkpoint chunks are (hash: string, data: binary) rows without nulls, got {excerpt(str(batch.schema))}"
        )
