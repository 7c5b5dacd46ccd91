"""The checkpoint calls on a server's Flight data plane (server/checkpoints/plane.py has the list).

One `CheckpointSession` owns the Flight client of one server and the calls' retries: a call that
fails as a Read stream would be resumed elsewhere (no server, a restart, a cut connection) is tried
on the next endpoint, once round the list. The
data port is the one the server names in its ListDatasets answer (its GetDataset's, for a Loader),
asked on the control port the Loader's endpoints name; an endpoint written `grpc+tcp://host:port`
or `grpc+tls://host:port` is a data plane itself. All ranks of a job start at the same endpoint (by
the job's name), so the ranks loading one checkpoint share that server's cache. A caller the server
knows by its client certificate (mTLS, no token) gets a grant in that ListDatasets answer and sends
it on each call with a proof over what the call asks (checkpoint_format.signed_bytes), as a Loader's
Read streams do (credentials.py).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from shardstream.checkpoint_format import CHUNK_SCHEMA, CHUNK_TICKET_PREFIX, signed_bytes
from shardstream.errors import (
    RETRYABLE_CODES,
    InvalidArgumentError,
    UnavailableError,
    from_flight_error,
)

from ..channel import GRANT_MARGIN_S, Connection, normalize_endpoints
from ..credentials import ChannelSecurity

__all__ = [
    "CHUNK_SCHEMA",
    "CHUNK_TICKET_PREFIX",
    "GET_BATCH_CHUNKS",
    "GET_STREAMS",
    "MAX_PUT_CHUNKS",
    "CheckpointSession",
    "chunk_batches",
]

T = TypeVar("T")

DISCOVERY_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 120.0  # one action or one batch of chunks
GET_BATCH_CHUNKS = 16  # chunks per DoGet of a load, at most
GET_STREAMS = 4  # DoGets of a load at once (its chunks spread over them)
MAX_PUT_CHUNKS = 4096  # chunks one DoPut names (the server's bound on a call's list of chunks)


def chunk_batches(names: Sequence[str]) -> list[list[str]]:
    """`names` cut into the DoGets of one load: GET_STREAMS of them at least (when there are that
    many chunks), GET_BATCH_CHUNKS chunks each at most."""
    size = max(1, min(GET_BATCH_CHUNKS, -(-len(names) // GET_STREAMS)))
    return [list(names[i : i + size]) for i in range(0, len(names), size)]
FLIGHT_OPTIONS = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000)]


class CheckpointSession:
    def __init__(self, endpoints: str | Sequence[str], job: str, security: ChannelSecurity) -> None:
        targets = normalize_endpoints(endpoints if isinstance(endpoints, str) else list(endpoints))
        start = int(hashlib.sha256(job.encode()).hexdigest(), 16) % len(targets)
        self.targets = targets[start:] + targets[:start]
        self.security = security
        self._headers = [(k.encode(), v.encode()) for k, v in security.metadata]
        self._lock = threading.Lock()
        self._pick = 0
        self._client: flight.FlightClient | None = None
        self._grant = b""  # ListDatasets' grant for a caller known by its client certificate
        self._grant_until = 0.0
        self.target = ""

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _connect(self) -> flight.FlightClient:
        with self._lock:
            stale = self._grant and time.monotonic() > self._grant_until - GRANT_MARGIN_S
            if self._client is not None and not stale:
                return self._client
            target = self.targets[self._pick % len(self.targets)]
            self._grant, self._grant_until = b"", 0.0
            if target.startswith(("grpc+tcp://", "grpc+tls://")):
                host, _, port = target.split("://", 1)[1].rpartition(":")
                data_port = int(port)
            else:
                host = target.rpartition(":")[0].strip("[]").removeprefix("dns:///")
                conn = Connection(target, self.security)
                try:
                    listing = conn.list_datasets(DISCOVERY_TIMEOUT_S)
                finally:
                    conn.close()
                data_port = listing.data_port if hasattr(listing, "data_port") else 0
                if getattr(listing, "data_grant", b""):
                    self._grant = listing.data_grant
                    self._grant_until = time.monotonic() + listing.data_grant_ttl_s
                if not data_port and listing.datasets:
                    data_port = listing.datasets[0].data_port
                if not data_port:
                    raise UnavailableError(
                        f"the server at {target} names no data port for checkpoints (upgrade the fleet, or name "
                        "its data plane as grpc+tcp://host:port)"
                    )
            self._client = self.security.flight_client(host, data_port, FLIGHT_OPTIONS)
            self.target = f"{host}:{data_port}"
            return self._client

    def _options(self, signed: bytes, timeout_s: float | None = CALL_TIMEOUT_S) -> flight.FlightCallOptions:
        """The call's headers: the token; or the grant with the proof over `signed` (signed_bytes:
        what the call asks) that this client holds the certificate the grant names."""
        headers = self._headers
        grant = self._grant
        if grant:
            headers = [*headers, *self.security.grant_headers(grant, signed)]
        return flight.FlightCallOptions(headers=headers, timeout=timeout_s)

    def _call(self, fn: Callable[[flight.FlightClient], T]) -> T:
        """`fn(client)`; on a status a stream is resumed elsewhere for (RETRYABLE_CODES: a server gone,
        stopping, overloaded; a connection cut), again on the next endpoint, once round the list.
        Every call is idempotent (chunks are content addressed, a part is replaced whole, a commit
        is create-if-absent)."""
        for attempt in range(len(self.targets) + 1):
            client = None
            try:
                client = self._connect()
                return fn(client)
            except (flight.FlightError, pa.ArrowException) as exc:
                error = from_flight_error(exc, target=self.target)
                if error.status not in RETRYABLE_CODES or attempt == len(self.targets):
                    raise error from exc
            except UnavailableError:
                if attempt == len(self.targets):
                    raise
            with self._lock:  # let go, not closed: another thread's call may still be on it
                if self._client is client or client is None:
                    self._client = None
                    self._pick += 1
        raise AssertionError("unreachable")

    # --- the calls ---------------------------------------------------------------------------------
    def action(self, kind: str, body: dict[str, Any]) -> Any:
        def call(client: flight.FlightClient) -> Any:
            raw = json.dumps(body).encode()
            results = list(client.do_action(flight.Action(kind, raw), self._options(signed_bytes(kind, raw))))
            return json.loads(results[0].body.to_pybytes()) if results else None

        return self._call(call)

    def put_chunks(self, job: str, chunks: Sequence[tuple[str, memoryview]]) -> dict[str, Any]:
        """Send chunks (name, bytes) in one DoPut (MAX_PUT_CHUNKS at most), one batch each, without
        copying their bytes."""

        def call(client: flight.FlightClient) -> dict[str, Any]:
            # the chunks it sends, named: the server takes no others (and a certificate caller's
            # proof signs this list, so a replayed call can only send these bytes again)
            command = json.dumps({"op": "chunks", "job": job, "hashes": [h for h, _ in chunks]}).encode()
            descriptor = flight.FlightDescriptor.for_command(command)
            writer, reader = client.do_put(descriptor, CHUNK_SCHEMA, self._options(signed_bytes("put", command), None))
            for h, data in chunks:
                writer.write_batch(_chunk_batch(h, data))
            writer.done_writing()
            meta = reader.read()
            writer.close()
            return json.loads(meta.to_pybytes()) if meta is not None else {}

        return self._call(call)

    def get_chunks(self, job: str, hashes: Sequence[str], on_chunk: Callable[[str, pa.Buffer], None]) -> None:
        """`on_chunk(name, bytes)` for each chunk as the server sends it. A server that fails
        UNAVAILABLE mid-way is left for the next endpoint, which sends the whole batch again (so
        `on_chunk` must be idempotent: a load writes each chunk to its place)."""
        ticket = flight.Ticket(CHUNK_TICKET_PREFIX + json.dumps({"job": job, "hashes": list(hashes)}).encode())

        def call(client: flight.FlightClient) -> None:
            for chunk in client.do_get(ticket, self._options(ticket.ticket)):
                batch = chunk.data
                data = batch.column(1)
                for i, h in enumerate(batch.column(0).to_pylist()):
                    on_chunk(h, data[i].as_buffer())

        self._call(call)


def _chunk_batch(h: str, data: memoryview) -> pa.RecordBatch:
    if data.nbytes > (1 << 31) - 1:
        raise InvalidArgumentError(f"a checkpoint chunk of {data.nbytes} bytes is over 2 GiB")
    body = pa.py_buffer(data)  # no copy: the staged tensor's bytes
    offsets = pa.py_buffer(memoryview(bytes(4) + data.nbytes.to_bytes(4, "little")))
    column = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, body])
    return pa.record_batch([pa.array([h]), column], schema=CHUNK_SCHEMA)
