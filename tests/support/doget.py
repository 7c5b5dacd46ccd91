"""A Read stream as a plain Flight client reads it, for tests that compare streams byte for byte.

`wire_messages(channel, request)` asks the server behind the gRPC `channel` (the worker that holds
that connection) for its data port, reads `request` there with a plain `pyarrow.flight` DoGet, and
returns each message as (header bytes, Arrow IPC stream bytes), the header without its stream id
(which differs from stream to stream).
"""

from __future__ import annotations

import grpc
import pyarrow.flight as flight

from shardstream.ipc import ipc_bytes
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["wire_messages"]


def wire_messages(channel: grpc.Channel, request: pb.ReadRequest) -> list[tuple[bytes, bytes]]:
    """A Read on the data port the server's GetDataset names, as wire bytes (header, rows)."""
    get = channel.unary_unary(
        "/shardstream.v1.ShardStream/GetDataset",
        request_serializer=pb.GetDatasetRequest.SerializeToString,
        response_deserializer=pb.DatasetInfo.FromString,
    )
    name = request.dataset or request.mixture[0].dataset
    return wire_messages_on(get(pb.GetDatasetRequest(dataset=name), timeout=60).data_port, request)


def wire_messages_on(port: int, request: pb.ReadRequest) -> list[tuple[bytes, bytes]]:
    """A Read on data port `port` (one worker's), as wire bytes (header, rows)."""
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        out = []
        for chunk in client.do_get(flight.Ticket(request.SerializeToString())):
            header = pb.ReadHeader.FromString(chunk.app_metadata.to_pybytes())
            header.ClearField("stream_id")
            out.append((header.SerializeToString(), ipc_bytes(chunk.data).to_pybytes()))
        return out
    finally:
        client.close()
