"""Read-stream message framing (see protos/shardstream/v1/shardstream.proto, rpc Read).

Each message is a valid protobuf encoding of `ReadResponse` laid out as

    0x0a <varint len(header)> <ReadHeader> 0x12 <varint len(payload)> <Arrow IPC stream>

with `ReadHeader.padding` sized so that the payload starts at a multiple of 16 bytes. Writing it by
hand costs one copy of the payload (into the message bytes that gRPC sends); reading it costs
none: the payload is a zero-copy slice of the received message, and Arrow's buffers inside it
stay aligned, so numeric columns reach numpy and torch without a copy.
"""

from __future__ import annotations

import pyarrow as pa

from shardstream.errors import DataLossError
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["ALIGNMENT", "decode_read_response", "encode_read_response", "ipc_bytes", "read_ipc"]

ALIGNMENT = 16
_HEADER_TAG = b"\x0a"  # field 1, length-delimited
_PAYLOAD_TAG = b"\x12"  # field 2, length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DataLossError("truncated varint in a Read message")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def ipc_bytes(batch: pa.RecordBatch) -> pa.Buffer:
    """Schema + one record batch as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def read_ipc(payload: pa.Buffer) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(payload)
    batch = reader.read_next_batch()
    return batch


def encode_read_response(header: pb.ReadHeader, payload: pa.Buffer) -> bytes:
    """The wire bytes of one Read message, the payload 16-byte aligned."""
    tail = _PAYLOAD_TAG + _varint(payload.size)
    for pad in range(0, 2 * ALIGNMENT + 2):
        header.padding = b"\0" * pad
        h = header.SerializeToString()
        prefix = _HEADER_TAG + _varint(len(h)) + h + tail
        if len(prefix) % ALIGNMENT == 0:
            return b"".join((prefix, memoryview(payload)))
    raise AssertionError("no padding aligns the payload")  # unreachable: some pad always fits


def decode_read_response(data: bytes) -> tuple[pb.ReadHeader, pa.Buffer]:
    """(header, payload) of one Read message; the payload is a view of `data`, not a copy."""
    view = memoryview(data)
    if len(view) > 0 and view[0:1] == _HEADER_TAG:
        hlen, pos = _read_varint(view, 1)
        hend = pos + hlen
        if hend < len(view) and view[hend : hend + 1] == _PAYLOAD_TAG:
            plen, ppos = _read_varint(view, hend + 1)
            if ppos + plen == len(view):
                header = pb.ReadHeader.FromString(view[pos:hend])
                return header, pa.py_buffer(view[ppos:])
    # Another writer's field order: decode the generic way (copies the payload once).
    msg = pb.ReadResponse.FromString(data)
    return msg.header, pa.py_buffer(msg.arrow_ipc)
