"""The Flight data-plane prototype (loadtest/flight_plane.py) sends what the grpcio Read stream sends.

For the same ReadRequest, a plain `pyarrow.flight.FlightClient` DoGet yields the headers and the
record batches of the servicer's framed messages, in order: the prototype the data-plane benchmark
measures is the same stream on another transport, not a lighter one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.flight_plane import ReadFlightServer, flight_messages
from shardstream.framing import decode_read_response, read_ipc
from shardstream.registry import Registry
from shardstream.server.build import MessageBuilder
from shardstream.server.read_plan import ReadPlanner
from shardstream.server.reader import new_row_group_cache
from shardstream.transform_spec import to_wire
from shardstream.v1 import shardstream_pb2 as pb


@pytest.fixture(scope="module")
def flight_server(data_root: Path) -> Iterator[ReadFlightServer]:
    server = ReadFlightServer(str(data_root))  # listens once built
    try:
        yield server
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    "req",
    [
        pb.ReadRequest(dataset="toy@1", world_size=1, batch_size=100),
        pb.ReadRequest(
            dataset="toy@1",
            seed=4,
            epoch=1,
            shuffle=pb.Shuffle(mode="block"),
            world_size=3,
            rank=2,
            batch_size=17,
        ),
        pb.ReadRequest(
            dataset="toy@2", shuffle=pb.Shuffle(mode="full"), world_size=2, batch_size=8, first_step=5
        ),
        pb.ReadRequest(
            dataset="toy@1", world_size=1, batch_size=64, first_step=1, step_stride=3, num_steps=4
        ),
        pb.ReadRequest(dataset="toy@1", world_size=1, batch_size=2000, start_offset=1009),  # nothing left
        pb.ReadRequest(
            dataset="toy@1",
            world_size=1,
            batch_size=50,
            transforms=to_wire([{"op": "text.tokenize", "column": "text", "tokenizer": "bytes"}]),
        ),
    ],
)
def test_flight_stream_equals_the_grpcio_stream(
    flight_server: ReadFlightServer, data_root: Path, req: pb.ReadRequest
) -> None:
    planner = ReadPlanner(Registry(data_root), new_row_group_cache(1 << 30))
    framed = [decode_read_response(m) for m in MessageBuilder().messages(planner.plan(req))]
    for header, _ in framed:
        header.ClearField("padding")  # the framing's alignment, not part of what a message says
    got = list(flight_messages(flight_server.port, req))
    assert [h for h, _ in got] == [h for h, _ in framed]
    for (_, batch), (_, payload) in zip(got, framed, strict=True):
        assert batch.equals(read_ipc(payload), check_metadata=True)
