"""Read-stream message framing (see protos/shardstream/v1/shardstream.proto, rpc Read).

Each message is a valid protobuf encoding of `ReadResponse` laid out as

    0x0a <varint len(header)> <ReadHeader> 0x12 <varint len(payload)> <Arrow IPC stream>

with `ReadHeader.padding` sized so that the payload starts at a multiple of 16 bytes. Writing it by
hand costs one copy of the payload: `encode_batch` sizes the IPC stream first (a counting pass that
copies nothing), then writes the header and the stream straight into the one `bytes` object gRPC
sends (grpcio takes exactly `bytes`, and copies it once more into its own buffer). Reading costs
none: the payload is a zero-copy slice of the received message, and Arrow's buffers inside it stay
aligned, so numeric columns reach numpy and torch without a copy.

No extension type other than Arrow's canonical ones crosses it, either way (extension_types.py):
the encoders write, and `read_ipc` returns, `plain_batch(batch)`.
"""

from __future__ import annotations

import ctypes
import sys

import pyarrow as pa

from shardstream.errors import DataLossError
from shardstream.extension_types import plain_batch
from shardstream.v1 import shardstream_pb2 as pb

__all__ = [
    "ALIGNMENT",
    "STREAM_ID_METADATA",
    "decode_read_response",
    "encode_batch",
    "encode_read_response",
    "ipc_bytes",
    "ipc_size",
    "read_ipc",
]

ALIGNMENT = 16
# Initial metadata of every Read stream: the server's id of the stream, which its log lines name
# (server/stream_log.py) and the client's failover lines repeat (client/session.py).
STREAM_ID_METADATA = "x-shardstream-stream-id"
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
    batch = plain_batch(batch)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def read_ipc(payload: pa.Buffer) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(payload)
    return plain_batch(reader.read_next_batch())


def ipc_size(batch: pa.RecordBatch) -> int:
    """Bytes of `ipc_bytes(batch)`, counted without writing them (no copy of the data)."""
    batch = plain_batch(batch)
    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.size()


def _prefix(header: pb.ReadHeader, payload_size: int) -> bytes:
    """Everything before the payload, padded so that the payload starts 16-byte aligned."""
    tail = _PAYLOAD_TAG + _varint(payload_size)
    for pad in range(0, 2 * ALIGNMENT + 2):
        header.padding = b"\0" * pad
        h = header.SerializeToString()
        prefix = _HEADER_TAG + _varint(len(h)) + h + tail
        if len(prefix) % ALIGNMENT == 0:
            return prefix
    raise AssertionError("no padding aligns the payload")  # unreachable: some pad always fits


def encode_read_response(header: pb.ReadHeader, payload: pa.Buffer) -> bytes:
    """The wire bytes of one Read message around an encoded IPC payload, the payload 16-byte aligned."""
    return b"".join((_prefix(header, payload.size), memoryview(payload)))


# CPython's PyBytes_FromStringAndSize(NULL, n): a bytes object of n uninitialised bytes, which the
# C API lets its creator fill before anyone else sees it. Elsewhere: None (encode_batch joins).
if sys.implementation.name == "cpython":
    _bytes_uninit = ctypes.pythonapi.PyBytes_FromStringAndSize
    _bytes_uninit.restype = ctypes.py_object
    _bytes_uninit.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
else:  # pragma: no cover
    _bytes_uninit = None


def encode_batch(header: pb.ReadHeader, batch: pa.RecordBatch) -> bytes:
    """The wire bytes of one Read message carrying `batch`: equal to
    `encode_read_response(header, ipc_bytes(batch))`, with one copy of the data instead of three
    (no growing IPC buffer, no join): the stream is written straight into the message."""
    batch = plain_batch(batch)
    size = ipc_size(batch)
    prefix = _prefix(header, size)
    if _bytes_uninit is None:  # pragma: no cover
        return encode_read_response(header, ipc_bytes(batch))
    total = len(prefix) + size
    out: bytes = _bytes_uninit(None, total)
    target = (ctypes.c_char * total).from_address(pa.py_buffer(out).address)
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(memoryview(target).cast("B")))
    sink.write(prefix)
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    if sink.tell() != total:
        raise AssertionError(f"IPC stream of {sink.tell() - len(prefix)} bytes, {size} counted")
    return out


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
