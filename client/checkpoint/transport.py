"""The checkpoint calls on a server's Flight data plane (server/checkpoints/plane.py has the list).

A `CheckpointSession` is the checkpoint calls over the client's one fleet session (transport/fleet.py):
the fleet's connections find each server's data plane (the port its ListDatasets answer names, asked
on the control port the Loader's endpoints name with data_plane_only: no dataset listed, no manifest
read), keep its grant fresh and its Flight client built with
the same FLIGHT_OPTIONS as a Loader's Read streams (a silent server is noticed after the same ping
timeout), and retry a call that fails as a Read stream would be resumed elsewhere (no server, a
restart, a cut connection) on the next endpoint, under the same kind of RetryPolicy: jittered
exponential backoff, within a number of failures and a time budget. All ranks of a job start at the
same endpoint (by the job's name), so the ranks loading one checkpoint share that server's cache. A
caller the server knows by its client certificate (mTLS, no token) gets a grant in that ListDatasets
answer and sends it on each call with a proof over what the call asks (checkpoint_format.signed_bytes),
as a Loader's Read streams do (credentials.py).

Each call's command travels as a `CheckpointCommand` (shardstream/checkpoint_commands.py: `action`
takes the fields of its JSON form and encodes them); the answers are JSON.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from shardstream.checkpoint_commands import encode_command
from shardstream.checkpoint_format import CHUNK_SCHEMA, CHUNK_TICKET_PREFIX, signed_bytes
from shardstream.errors import InvalidArgumentError

from ..credentials import ChannelSecurity
from ..spec import RetryPolicy
from ..transport.channel import DataPlane, normalize_endpoints
from ..transport.fleet import Fleet

__all__ = [
    "CHUNK_SCHEMA",
    "CHUNK_TICKET_PREFIX",
    "GET_BATCH_CHUNKS",
    "GET_STREAMS",
    "MAX_PUT_CHUNKS",
    "CheckpointSession",
    "chunk_batches",
]

CALL_TIMEOUT_S = 120.0  # one action or one batch of chunks
GET_BATCH_CHUNKS = 16  # chunks per DoGet of a load, at most
GET_STREAMS = 4  # DoGets of a load at once (its chunks spread over them)
MAX_PUT_CHUNKS = 4096  # chunks one DoPut names (the server's bound on a call's list of chunks)


def chunk_batches(names: Sequence[str]) -> list[list[str]]:
    """`names` cut into the DoGets of one load: GET_STREAMS of them at least (when there are that
    many chunks), GET_BATCH_CHUNKS chunks each at most."""
    size = max(1, min(GET_BATCH_CHUNKS, -(-len(names) // GET_STREAMS)))
    return [list(names[i : i + size]) for i in range(0, len(names), size)]


class CheckpointSession:
    """The checkpoint calls of one job over its own `Fleet` (transport/fleet.py): endpoints, retries,
    data planes and grants are the fleet's."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        job: str,
        security: ChannelSecurity,
        retry: RetryPolicy | None = None,
    ) -> None:
        targets = normalize_endpoints(endpoints if isinstance(endpoints, str) else list(endpoints))
        start = int(hashlib.sha256(job.encode()).hexdigest(), 16) % len(targets)
        self.targets = targets[start:] + targets[:start]
        self.security = security
        self.fleet = Fleet(self.targets, security, retry or RetryPolicy(), owner="Checkpointer")

    @property
    def target(self) -> str:
        """host:port of the data plane the calls go to now ("" before the first call)."""
        return self.fleet.data_target

    def close(self) -> None:
        self.fleet.close()

    # --- the calls ---------------------------------------------------------------------------------
    def action(self, kind: str, body: dict[str, Any], retry: RetryPolicy | None = None) -> Any:
        """One DoAction, under `retry` when given (follow()'s longer budget), else the fleet's policy."""
        raw = encode_command(kind, body)

        def call(plane: DataPlane) -> Any:
            options = plane.options(signed_bytes(kind, raw), CALL_TIMEOUT_S)
            results = list(plane.client.do_action(flight.Action(kind, raw), options))
            return json.loads(results[0].body.to_pybytes()) if results else None

        return self.fleet.call(call, retry)

    def put_chunks(self, job: str, chunks: Sequence[tuple[str, memoryview]]) -> dict[str, Any]:
        """Send chunks (name, bytes) in one DoPut (MAX_PUT_CHUNKS at most), one batch each, without
        copying their bytes."""

        def call(plane: DataPlane) -> dict[str, Any]:
            # the chunks it sends, named: the server takes no others (and a certificate caller's
            # proof signs this list, so a replayed call can only send these bytes again)
            command = encode_command("chunks.put", {"job": job, "hashes": [h for h, _ in chunks]})
            descriptor = flight.FlightDescriptor.for_command(command)
            options = plane.options(signed_bytes("put", command), None)
            writer, reader = plane.client.do_put(descriptor, CHUNK_SCHEMA, options)
            for h, data in chunks:
                writer.write_batch(_chunk_batch(h, data))
            writer.done_writing()
            meta = reader.read()
            writer.close()
            return json.loads(meta.to_pybytes()) if meta is not None else {}

        return self.fleet.call(call)

    def get_chunks(self, job: str, hashes: Sequence[str], on_chunk: Callable[[str, pa.Buffer], None]) -> None:
        """`on_chunk(name, bytes)` for each chunk as the server sends it. A server that fails
        UNAVAILABLE mid-way is left for the next endpoint, which sends the whole batch again (so
        `on_chunk` must be idempotent: a load writes each chunk to its place)."""
        ticket = flight.Ticket(CHUNK_TICKET_PREFIX + encode_command("chunks.get", {"job": job, "hashes": list(hashes)}))

        def call(plane: DataPlane) -> None:
            for chunk in plane.client.do_get(ticket, plane.options(ticket.ticket, CALL_TIMEOUT_S)):
                batch = chunk.data
                data = batch.column(1)
                for i, h in enumerate(batch.column(0).to_pylist()):
                    on_chunk(h, data[i].as_buffer())

        self.fleet.call(call)


def _chunk_batch(h: str, data: memoryview) -> pa.RecordBatch:
    if data.nbytes > (1 << 31) - 1:
        raise InvalidArgumentError(f"a checkpoint chunk of {data.nbytes} bytes is over 2 GiB")
    body = pa.py_buffer(data)  # no copy: the staged tensor's bytes
    offsets = pa.py_buffer(memoryview(bytes(4) + data.nbytes.to_bytes(4, "little")))
    column = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, body])
    return pa.record_batch([pa.array([h]), column], schema=CHUNK_SCHEMA)
