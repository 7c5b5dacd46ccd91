"""Structured stream logs: `serve --log-format json|text`, a stream.start and a stream.end line per Read
stream under an id the client gets in the initial metadata, errors naming it, and the client's
failover line naming the id of the stream that broke — so one id leads from a trainer's log to the
server's lines, across a server killed mid-stream."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import grpc
import pytest

from shardstream.client import Loader
from shardstream.client.transport.channel import Connection
from shardstream.errors import InvalidArgumentError
from shardstream.v1 import shardstream_pb2 as pb

from .support import media
from .support.data import N_ROWS, write_dataset
from .support.servers import Servers, wait_for


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logs") / "root"
    write_dataset(root, "toy", N_ROWS)
    # 24 MiB of 1 MiB rows: more than flow control lets a server send ahead of a client that waits
    blobs = [(str(i), os.urandom(1 << 20)) for i in range(24)]
    media.write_table(root, "blobs", media.blob_table("blob", blobs), row_group_rows=1, shard_rows=8)
    return root


def events(log: Path) -> list[dict[str, Any]]:
    """The JSON lines of a server's log (gRPC's C core writes its own few lines beside them)."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def stream_events(log: Path, stream_id: str) -> dict[str, dict[str, Any]]:
    return {e["event"]: e for e in events(log) if e.get("stream_id") == stream_id}


def test_a_failover_line_names_the_stream_the_dead_server_logged(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    with Servers(root) as fleet:
        a, b = (fleet.start(log_path=log, extra_args=("--log-format", "json")) for log in logs)
        caplog.set_level(logging.INFO, logger="shardstream.client")
        with Loader([a.target, b.target], "blobs@1", batch_size=1, prefetch=1, shuffle=False) as loader:
            batches = iter(loader)
            next(batches)  # rank 0 reads from the first endpoint: a
            wait_for(
                lambda: any(e.get("event") == "stream.start" for e in events(logs[0])), "a's stream.start"
            )
            a.kill()
            rest = sum(1 for _ in batches)
        assert rest == 23
    failover = next(r.getMessage() for r in caplog.records if "failing over to" in r.getMessage())
    stream_id = failover.split("stream ", 1)[1].split(" ", 1)[0]
    assert len(stream_id) == 16 and a.target in failover and b.target in failover
    on_a = stream_events(logs[0], stream_id)
    assert set(on_a) == {"stream.start"}  # killed: it never logged the end
    start = on_a["stream.start"]
    assert start["dataset"] == "blobs@1" and start["rank"] == 0 and start["world_size"] == 1
    assert start["offset"] == 0 and start["peer"].startswith("ipv") and start["level"] == "INFO"
    # b logged the resumed stream from its first missing step to the end: how many steps a had sent
    # before it died depends on the machine's speed, but b's stream starts where they end (batch_size
    # 1: offset + first_step is the steps already received) and covers the rest of the 24
    starts = [e for e in events(logs[1]) if e.get("event") == "stream.start"]
    ends = [e for e in events(logs[1]) if e.get("event") == "stream.end"]
    assert len(starts) == 1 and len(ends) == 1 and ends[0]["outcome"] == "OK"
    resumed_at = starts[0]["offset"] + starts[0]["first_step"]
    assert 1 <= resumed_at and resumed_at + ends[0]["steps"] == 24, (starts, ends)
    assert ends[0]["bytes"] > ends[0]["steps"] << 20 and ends[0]["duration_s"] > 0
    assert ends[0]["rows"] == ends[0]["steps"]


def test_errors_carry_the_stream_id_in_text_and_json(root: Path, tmp_path: Path) -> None:
    for fmt in ("text", "json"):
        log = tmp_path / f"{fmt}.log"
        with Servers(root) as fleet:
            server = fleet.start(log_path=log, extra_args=("--log-format", fmt))
            conn = Connection(server.target)
            try:
                call = conn.read(pb.ReadRequest(dataset="toy@1", world_size=1, batch_size=0))
                with pytest.raises(InvalidArgumentError) as err:
                    list(call)
                assert err.value.status == grpc.StatusCode.INVALID_ARGUMENT
                stream_id = call.stream_id  # the read call's (client/transport/flight_call.py ReadCall)
                assert stream_id and err.value.stream_id == stream_id
                ok = conn.read(pb.ReadRequest(dataset="toy@1", world_size=1, batch_size=100))
                assert sum(1 for _ in ok) >= 1
                ok_id = ok.stream_id
                assert ok_id
            finally:
                conn.close()
        if fmt == "json":
            failed = stream_events(log, stream_id)["stream.end"]
            assert failed["outcome"] == "InvalidArgument" and "batch_size" in failed["error"]
            done = stream_events(log, ok_id)
            assert done["stream.end"]["outcome"] == "OK" and done["stream.end"]["rows"] == N_ROWS
            assert done["stream.start"]["dataset"] == "toy@1" and done["stream.end"]["steps"] == 11
        else:
            lines = log.read_text().splitlines()
            end = next(x for x in lines if "stream.end" in x and f"stream_id={stream_id}" in x)
            assert "outcome=InvalidArgument" in end and "error=" in end
            assert any("stream.end" in x and f"stream_id={ok_id}" in x and "outcome=OK" in x for x in lines)
