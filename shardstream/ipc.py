"""Arrow IPC helpers of the data plane, and the header that names a Read stream.

A Read stream is an Arrow Flight DoGet (server/serving/data_plane.py): each message is one record batch
on Flight's wire — its buffers written into gRPC without a Python copy — with the message's
serialized `ReadHeader` as the batch's app_metadata (protos/shardstream/v1/shardstream.proto). These
helpers size a batch as an IPC stream without writing it (`ipc_size`, the server's message cap),
write one (`ipc_bytes`, for tests and the disk caches) and read one back (`read_ipc`).

No extension type other than Arrow's canonical ones crosses the data plane, either way
(extension_types.py): the server sends, and the client and `read_ipc` keep, `plain_batch(batch)`.
"""

from __future__ import annotations

import pyarrow as pa

from shardstream.extension_types import plain_batch

__all__ = ["STREAM_ID_METADATA", "ipc_bytes", "ipc_size", "plain_batch", "read_ipc"]

# A response header of every Read stream: the server's id of the stream, which its log lines name
# (server/serving/stream_log.py) and the client's failover lines repeat (client/transport/session.py).
STREAM_ID_METADATA = "x-shardstream-stream-id"


def ipc_bytes(batch: pa.RecordBatch) -> pa.Buffer:
    """Schema + one record batch as an Arrow IPC stream."""
    batch = plain_batch(batch)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def read_ipc(payload: pa.Buffer) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(payload)
    return plain_batch(reader.read_next_batch())


def ipc_size(batch: pa.RecordBatch) -> int:
    """Bytes of `ipc_bytes(batch)`, counted without writing them (no copy of the data).

    Without dictionaries the stream is the schema's message, the batch's and the 8-byte end marker,
    counted by Arrow's C++ at a third of a stream writer's cost (~9 vs ~27 us a message: issue #26);
    the schema's part is counted once per schema (~9 -> ~2 us a message)."""
    batch = plain_batch(batch)
    schema = batch.schema
    framing = _framing(schema)
    if framing is not None:
        return pa.ipc.get_record_batch_size(batch) + framing
    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch)
    return sink.size()


_END_OF_STREAM_BYTES = 8  # the continuation marker and a zero length

# The last schemas sized and their stream's bytes around the batch (None: it has dictionaries),
# newest first; as extension_types._RECENT, replaced whole, never mutated: read without a lock.
_FRAMING: tuple[tuple[pa.Schema, int | None], ...] = ()
_FRAMING_MAX = 16


def _framing(schema: pa.Schema) -> int | None:
    """Bytes of `schema`'s stream besides its batch (its schema message and end marker), or None
    when it has dictionaries (they travel as messages of their own)."""
    global _FRAMING
    recent = _FRAMING
    for seen, framing in recent:
        if schema.equals(seen, check_metadata=True):
            return framing
    framing = (
        None
        if any(_has_dictionary(f.type) for f in schema)
        else schema.serialize().size + _END_OF_STREAM_BYTES
    )
    _FRAMING = ((schema, framing), *recent[: _FRAMING_MAX - 1])
    return framing


def _has_dictionary(t: pa.DataType) -> bool:
    """Whether `t` is or holds a dictionary type (a stream carries its dictionaries too)."""
    if pa.types.is_dictionary(t):
        return True
    return any(_has_dictionary(t.field(i).type) for i in range(t.num_fields))
