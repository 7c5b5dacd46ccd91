"""Client keepalive within what each server allows: a long training step costs no stream.

pyarrow's Flight server (the data plane) takes no gRPC server options, so it polices pings with gRPC's
defaults: while it sends nothing, a ping sooner than 5 min after the last is a strike, on a connection
without calls any ping is, and the third strike ends the connection (GOAWAY ENHANCE_YOUR_CALM
"too_many_pings"), cutting its streams. A real server and a Loader in a process of its own, both
with gRPC's keepalive trace (GRPC_TRACE=http_keepalive): the Loader reads a batch, pauses with its
stream waiting (a training step), reads on to the end of the epoch, then idles without a call.

The pauses count pings, not seconds: each lasts PAUSE_PINGS keepalive pings that the server's control
port sends to this client (serve --keepalive-time 1), while the Loader's data-plane keepalive time is
lowered to the same 1 s (only here: more pings, a stricter test; the shipped time is 10 s). A busy
machine makes the pauses longer, never shorter in pings. The eager run, with the data-plane options
from before they matched the Flight server (pings without calls, any number without data), is cut
by that GOAWAY during the same pause: the test sees what it looks for.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.common import write_vectors
from shardstream.client.transport.channel import CHANNEL_OPTIONS, FLIGHT_OPTIONS
from shardstream.server.backends.roots import open_registry
from shardstream.server.lifecycle import SERVER_OPTIONS
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

from .support.servers import wait_for

REPO = Path(__file__).resolve().parent.parent
ROWS = 120_000  # 264 B rows, 32 MB: far more than the Loader's buffers hold, so its stream waits
KEEPALIVE_MS = 1000  # the data plane's keepalive time in the test (and the server's pings)
PAUSE_PINGS = 8  # the eager options are cut after 4 pings (the third strike)
TRACE = {"GRPC_VERBOSITY": "DEBUG", "GRPC_TRACE": "http_keepalive"}
SERVER_PING = re.compile(r"SERVER\[0x[0-9a-f]+\]: Ping \d+ sent")
GOAWAY = re.compile(r"too_many_pings|ENHANCE_YOUR_CALM|GOAWAY received")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    base = tmp_path_factory.mktemp("keepalive")
    src = base / "vectors.parquet"
    write_vectors(src, ROWS, 64)
    with open_registry(str(base / "root")) as registry:
        ingest(src, "vec", registry, IngestOptions(progress=False))
    return str(base / "root")


@pytest.fixture
def server(root: str, tmp_path: Path) -> Iterator[LocalServer]:
    s = LocalServer(root, log_path=tmp_path / "server.log", env=TRACE, extra_args=("--keepalive-time", "1"))
    try:
        yield s.start()
    finally:
        s.stop()


def _server_pings(log: Path) -> int:
    """Keepalive pings the server has sent (only its control port sends any: the Flight server has no
    keepalive, and no data comes from a paused client to make it probe bandwidth)."""
    return len(SERVER_PING.findall(log.read_text(errors="replace")))


def _pause(log: Path, what: str) -> None:
    """Until the server has sent PAUSE_PINGS more keepalive pings."""
    until = _server_pings(log) + PAUSE_PINGS
    wait_for(lambda: _server_pings(log) >= until, f"{PAUSE_PINGS} pings during {what}", timeout_s=300)


def _run(server: LocalServer, workdir: Path, *mode: str) -> tuple[str, str, int]:
    """The Loader's process through both pauses: (its stderr, the server's log, streams started)."""
    assert server.log_path is not None
    log = Path(server.log_path)
    err = workdir / "client.err"
    with err.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.keepalive_rank", server.target, "vec", str(workdir)]
            + [str(KEEPALIVE_MS), *mode],
            cwd=REPO,
            env={**os.environ, **TRACE},
            stderr=f,
            start_new_session=True,
        )
    try:
        wait_for(lambda: (workdir / "paused").exists() or proc.poll() is not None, "the first batch", 300)
        _pause(log, "the training step")
        (workdir / "go").write_text("")
        wait_for(lambda: (workdir / "read").exists() or proc.poll() is not None, "the epoch's end", 300)
        _pause(log, "the idle Loader")
        (workdir / "go-idle").write_text("")
        assert proc.wait(timeout=300) == 0, err.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    batches, rows = map(int, (workdir / "read").read_text().split())
    assert rows == ROWS and batches == -(-ROWS // 256)  # the whole epoch, once
    text = log.read_text(errors="replace")
    return err.read_text(errors="replace"), text, text.count("stream.start")


def test_a_long_training_step_and_an_idle_loader_cost_no_ping_strike(
    server: LocalServer, tmp_path: Path
) -> None:
    client, log, streams = _run(server, tmp_path)
    assert not GOAWAY.findall(client) and not GOAWAY.findall(log)
    assert streams == 1  # the stream was never cut and resumed
    assert not re.findall(r"^E\d{4}", client, re.M), "gRPC logged an error on the client"
    # counted: never the third strike (the GOAWAY); at most the ping that goes out with the client's
    # window update as it reads on, before the server's next data (or two, where that data is slow)
    assert max(_strikes(log)) <= 2


def _strikes(log: str) -> list[int]:
    """Strikes on the connection after each ping the server received (either plane): a ping is one
    when it comes before the connection's next allowed ping (-inf: the server sent data since)."""
    out = []
    for now, allowed, before in re.findall(
        r"received ping \d+: now=@(-?\d+)ms transport_idle=\d next_allowed_ping=@(\S+) ping_strikes=(\d+)",
        log,
    ):
        strike = allowed.endswith("ms") and int(now) < int(allowed.removesuffix("ms"))
        out.append(int(before) + strike)
    assert out, "no ping in the server's trace (GRPC_TRACE=http_keepalive)"
    return out


def test_the_eager_options_are_cut_during_the_same_pause(server: LocalServer, tmp_path: Path) -> None:
    client, log, streams = _run(server, tmp_path, "eager")
    assert "too_many_pings" in client and "too_many_pings" in log
    assert max(_strikes(log)) == 3  # the third strike: GOAWAY
    assert streams >= 2  # cut, and resumed from the first step not received


def test_each_plane_s_keepalive_is_within_its_server_s_policy() -> None:
    client, flight, server = dict(CHANNEL_OPTIONS), dict(FLIGHT_OPTIONS), dict(SERVER_OPTIONS)
    # the control port's server (ours): pings every 5 s allowed, also without calls
    assert client["grpc.keepalive_time_ms"] >= server["grpc.http2.min_ping_interval_without_data_ms"]
    assert client["grpc.keepalive_permit_without_calls"] <= server["grpc.keepalive_permit_without_calls"]
    # the Flight server (gRPC's defaults): no pings without calls; one per frame the client sends
    assert flight["grpc.keepalive_permit_without_calls"] == 0
    assert flight["grpc.http2.max_pings_without_data"] == 1
    assert flight["grpc.keepalive_time_ms"] == client["grpc.keepalive_time_ms"]  # a silent server is noticed
