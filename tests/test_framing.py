from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from shardstream.framing import (
    ALIGNMENT,
    decode_read_response,
    encode_batch,
    encode_read_response,
    ipc_bytes,
    read_ipc,
)
from shardstream.v1 import shardstream_pb2 as pb


@pytest.mark.parametrize("nsteps", [0, 1, 2, 5, 17, 130, 1000])
@pytest.mark.parametrize("rows", [0, 1, 33])
def test_frame_round_trip_is_aligned_and_a_valid_proto(nsteps: int, rows: int) -> None:
    batch = pa.record_batch({"a": np.arange(rows, dtype=np.int64), "b": np.ones(rows, dtype=np.float32)})
    header = pb.ReadHeader(epoch=3, end_of_epoch=bool(nsteps % 2), dropped=nsteps)
    for i in range(nsteps):
        header.steps.add(
            step=i, position_start=i * 1000, position_end=i * 1000 + 7, global_start=i, global_end=2**40 + i
        )
    payload = ipc_bytes(batch)
    data = encode_read_response(header, payload)

    got_header, got_payload = decode_read_response(data)
    got_header.ClearField("padding")
    header.ClearField("padding")
    assert got_header == header
    assert (len(data) - got_payload.size) % ALIGNMENT == 0
    assert read_ipc(got_payload).equals(batch)
    # Zero copy: the payload is a view into the received bytes.
    assert got_payload.address == pa.py_buffer(data).address + len(data) - got_payload.size
    # A generic protobuf decoder sees the same message.
    generic = pb.ReadResponse.FromString(data)
    generic.header.ClearField("padding")
    assert generic.header == header and generic.arrow_ipc == payload.to_pybytes()


def test_decode_accepts_a_generically_encoded_message() -> None:
    batch = pa.record_batch({"a": [1, 2, 3]})
    msg = pb.ReadResponse(header=pb.ReadHeader(epoch=1), arrow_ipc=ipc_bytes(batch).to_pybytes())
    # Fields written in the other order still decode.
    data = (
        pb.ReadResponse(arrow_ipc=msg.arrow_ipc).SerializeToString()
        + pb.ReadResponse(header=msg.header).SerializeToString()
    )
    header, payload = decode_read_response(data)
    assert header.epoch == 1 and read_ipc(payload).equals(batch)


@pytest.mark.parametrize("rows", [0, 1, 33, 4099])
@pytest.mark.parametrize("sliced", [False, True])
def test_encode_batch_writes_the_same_bytes_as_encode_read_response(rows: int, sliced: bool) -> None:
    ids = np.arange(rows, dtype=np.int64)
    batch = pa.record_batch(
        {
            "id": ids,
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 5).astype(np.float32)), 5),
            "text": pa.array([f"row-{i}" * (i % 4) for i in ids]),
            "maybe": pa.array([None if i % 3 else float(i) for i in ids], type=pa.float64()),
        }
    )
    if sliced:  # an unshuffled read hands the encoder zero-copy slices with an offset
        batch = batch.slice(rows // 3, rows // 2)
    header = pb.ReadHeader(epoch=1, end_of_epoch=True)
    for i in range(rows % 7 + 1):
        header.steps.add(step=i, position_start=i, position_end=i + 1)
    expected = encode_read_response(header, ipc_bytes(batch))
    data = encode_batch(header, batch)
    assert type(data) is bytes and data == expected
    got_header, payload = decode_read_response(data)
    assert read_ipc(payload).equals(batch)
