"""The Arrow Flight data plane (server/serving/data_plane.py, data_plane.py) against real servers: the
Loader's streams keep the exactly-once, failover and provenance contracts; a plain pyarrow FlightClient reads a rank's stream with nothing but a ReadRequest;
errors keep their status codes and retry hints; a silent Flight server is abandoned for another;
tokens, admission, the write timeout and certificate rotation hold on the Flight port as on the gRPC
one (certificate principals, by grant: test_grants.py).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow.flight as flight
import pytest
import yaml

from shardstream.client import Loader
from shardstream.client.transport.channel import Connection
from shardstream.errors import FlightStatus, UnauthenticatedError, UnavailableError, to_flight_error
from shardstream.server.local_fleet import LocalServer
from shardstream.server.policy.auth import token_sha256
from shardstream.v1 import shardstream_pb2 as pb

from .support.certs import Issued, Pki, write_atomic
from .support.data import write_dataset
from .support.servers import Servers, scrape, unused_port, wait_for
from .support.stalls import Streams, stalled_process, write_blobs

N = 1500
TOKEN = "flight-token-0123456789"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("flight") / "root"
    write_dataset(root, "toy", N, row_group_rows=100, shard_rows=400)
    write_blobs(root, "blobs", 256, 64 << 10)  # 16 MiB of incompressible rows: a stream left unread
    return root


@pytest.fixture(scope="module")
def servers(root: Path) -> Iterator[Servers]:
    with Servers(root) as s:
        yield s


@pytest.fixture(scope="module")
def pair(servers: Servers) -> list[LocalServer]:
    return [servers.start(metrics=True) for _ in range(2)]


def read_ids(endpoints: list[str], **kw: object) -> list[int]:
    kw.setdefault("batch_size", 50)
    with Loader(endpoints, "toy@1", output="numpy", epochs=1, **kw) as ld:  # type: ignore[arg-type]
        return [int(i) for b in ld for i in b["id"]]


def test_get_dataset_names_the_data_port_of_the_worker_that_answered(pair, servers) -> None:  # type: ignore[no-untyped-def]
    info = pair[0].info()
    assert info["data_port"] and info["data_port"] != pair[0].port
    c = Connection(pair[0].target)
    try:
        assert c.get_dataset("toy", 5).data_port == info["data_port"]
    finally:
        c.close()
    base = unused_port()
    workers = servers.start(workers=2, extra_args=("--data-port", str(base)))
    seen = set()
    for _ in range(40):  # new connections: the kernel spreads them over the two workers
        c = Connection(workers.target)
        try:
            seen.add(c.get_dataset("toy", 5).data_port)
        finally:
            c.close()
        if len(seen) == 2:
            break
    assert seen <= {base, base + 1} and seen, seen


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 7])
def test_every_sample_once_and_the_same_stream_from_any_server(pair, servers, world, seed) -> None:  # type: ignore[no-untyped-def]
    other = servers.start(workers=2)
    endpoints = [s.target for s in pair]
    got, want = [], []
    for rank in range(world):
        kw = dict(rank=rank, world_size=world, batch_size=16, seed=seed, shuffle="block")
        got += read_ids(endpoints, **kw)
        want += read_ids([other.target], **kw)
    assert got == want  # the same stream, sample for sample, whichever server sent it
    assert sorted(got) == list(range(N))
    m = scrape(pair[0])
    key = 'grpc_server_started_total{grpc_method="DoGet",grpc_service="arrow.flight.protocol.FlightService",grpc_type="server_stream"}'
    assert m[key] >= 1


def test_a_server_killed_mid_epoch_fails_over_with_nothing_lost_or_repeated(servers, root) -> None:  # type: ignore[no-untyped-def]
    a, b = servers.start(), servers.start()
    ids: list[int] = []
    with Loader([a.target, b.target], "toy@1", output="numpy", epochs=1, batch_size=10, prefetch=1) as ld:
        for i, batch in enumerate(ld):
            ids += [int(x) for x in batch["id"]]
            if i == 5:
                a.kill()  # its stream breaks; the next endpoint continues at the first missing step
    assert sorted(ids) == list(range(N))
    assert len(ids) == N


def test_a_plain_flight_client_reads_a_ranks_stream(pair) -> None:  # type: ignore[no-untyped-def]
    """No shardstream code on the client: the ticket is a ReadRequest, app_metadata its ReadHeader."""
    request = pb.ReadRequest(dataset="toy@1", seed=3, epoch=0, rank=1, world_size=2, batch_size=32)
    request.shuffle.mode = "full"
    client = flight.connect(f"grpc://127.0.0.1:{pair[0].info()['data_port']}")
    try:
        reader = client.do_get(flight.Ticket(request.SerializeToString()))
        ids, steps = [], []
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            header = pb.ReadHeader.FromString(chunk.app_metadata.to_pybytes())
            steps += [st.step for st in header.steps]
            ids += chunk.data.column("id").to_pylist()
    finally:
        client.close()
    want = read_ids([pair[0].target], rank=1, world_size=2, batch_size=32, seed=3, shuffle="full")
    assert ids == want
    assert steps == list(range(len(steps))) and header.end_of_epoch


def test_a_missing_dataset_is_not_found_and_a_bad_ticket_invalid_argument(pair) -> None:  # type: ignore[no-untyped-def]
    port = pair[0].info()["data_port"]
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        for ticket, code in (
            (b"\xff\xff not a request", "INVALID_ARGUMENT"),
            (pb.ReadRequest(dataset="nope@1", batch_size=4, world_size=1).SerializeToString(), "NOT_FOUND"),
        ):
            with pytest.raises(flight.FlightError) as info:
                client.do_get(flight.Ticket(ticket)).read_all()
            status = FlightStatus.of(info.value)
            assert status.code().name == code, (code, status.details())
            assert str(info.value).startswith(code)  # what a plain Flight client reads
    finally:
        client.close()


def test_the_status_and_retry_hint_round_trip() -> None:
    for code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DATA_LOSS, grpc.StatusCode.UNAVAILABLE):
        exc = to_flight_error(code, "why", retry_after_s=0.25)
        status = FlightStatus.of(exc)
        assert (status.code(), status.details()) == (code, "why")
        assert dict(status.trailing_metadata())["grpc-retry-pushback-ms"] == "250"
    plain = FlightStatus.of(flight.FlightUnavailableError("gone. gRPC client debug context: x"))
    assert plain.code() == grpc.StatusCode.UNAVAILABLE and plain.details() == "gone"


def test_a_full_server_is_resource_exhausted_with_its_hint_and_the_loader_goes_elsewhere(servers) -> None:  # type: ignore[no-untyped-def]
    full = servers.start(extra_args=("--max-streams", "1"))
    other = servers.start()
    blobs = pb.ReadRequest(dataset="blobs@1", world_size=1, batch_size=4, max_message_bytes=256 << 10)
    with Streams(full.target) as streams:
        assert streams.flights  # over the Flight plane
        assert streams.open(blobs, 1) == [grpc.StatusCode.OK]  # holds the one slot: 16 MiB, unread
        refusal = streams.refusal(blobs)
        assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "grpc-retry-pushback-ms" in dict(refusal.trailing_metadata())
        assert sorted(read_ids([full.target, other.target], batch_size=50)) == list(range(N))


def test_tokens_are_checked_on_the_data_plane(servers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        yaml.safe_dump(
            {"principals": [{"name": "a", "token_sha256": token_sha256(TOKEN), "datasets": ["toy"]}]}
        )
    )
    server = servers.start(extra_args=("--auth", str(auth)))
    assert sorted(read_ids([server.target], token=TOKEN)) == list(range(N))
    request = pb.ReadRequest(dataset="toy@1", batch_size=4, world_size=1)
    client = flight.connect(f"grpc://127.0.0.1:{server.info()['data_port']}")
    try:
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.do_get(flight.Ticket(request.SerializeToString())).read_all()
        bad = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer wrong")])
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.do_get(flight.Ticket(request.SerializeToString()), bad).read_all()
    finally:
        client.close()
    with pytest.raises(UnauthenticatedError):
        read_ids([server.target], token="")


class _Silent(flight.FlightServerBase):  # type: ignore[misc]
    """A purpose-built data plane that takes a DoGet and never answers it."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.calls = 0
        self.release = threading.Event()

    def do_get(self, context, ticket):  # type: ignore[no-untyped-def]
        self.calls += 1
        while not self.release.wait(0.05) and not context.is_cancelled():
            pass
        raise flight.FlightUnavailableError("released")


def test_a_silent_flight_server_is_abandoned_for_another(pair) -> None:  # type: ignore[no-untyped-def]
    """The idle watchdog gives up on a DoGet that never returns (it cannot be cancelled itself)."""
    silent = _Silent()
    info = Connection(pair[0].target).get_dataset("toy@1", 5)
    info.data_port = silent.port

    class Front(grpc.GenericRpcHandler):  # GetDataset answered here, pointing at the silent plane
        def service(self, details):  # type: ignore[no-untyped-def]
            if details.method.endswith("/GetDataset"):
                return grpc.unary_unary_rpc_method_handler(
                    lambda req, ctx: info,
                    request_deserializer=pb.GetDatasetRequest.FromString,
                    response_serializer=pb.DatasetInfo.SerializeToString,
                )
            return None

    from concurrent import futures

    front = grpc.server(futures.ThreadPoolExecutor(4))
    front.add_generic_rpc_handlers((Front(),))
    port = front.add_insecure_port("127.0.0.1:0")
    front.start()
    try:
        ids = read_ids([f"127.0.0.1:{port}", pair[1].target], batch_size=100, stream_idle_timeout_s=1.0)
        assert sorted(ids) == list(range(N)) and silent.calls >= 1
    finally:
        silent.release.set()
        front.stop(0)
        silent.shutdown()


def test_the_data_planes_certificate_is_rotated_without_a_restart_and_open_streams_finish(
    servers, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    p = Pki(tmp_path / "pki")
    old_ca, new_ca = p.ca("old-ca"), p.ca("new-ca")
    old, new = p.server(old_ca, "old"), p.server(new_ca, "new")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_atomic(cert, old.pem)
    write_atomic(key, old.key.read_bytes())
    server = servers.start(
        extra_args=("--tls-cert", str(cert), "--tls-key", str(key)),
        credentials=grpc.ssl_channel_credentials(old_ca.pem),
    )
    port = server.info()["data_port"]
    request = pb.ReadRequest(dataset="toy@1", batch_size=10, world_size=1).SerializeToString()

    def client(ca: Issued) -> flight.FlightClient:
        return flight.connect(f"grpc+tls://127.0.0.1:{port}", tls_root_certs=ca.pem)

    def trusted_by(ca: Issued) -> bool:
        c = client(ca)
        try:
            c.do_get(flight.Ticket(request)).read_chunk()
            return True
        except flight.FlightError:
            return False
        finally:
            c.close()

    assert trusted_by(old_ca) and not trusted_by(new_ca)
    open_before = client(old_ca)
    reader = open_before.do_get(flight.Ticket(request))
    ids = reader.read_chunk().data.column("id").to_pylist()
    write_atomic(key, new.key.read_bytes())  # the key first: a moment where the pair does not match
    write_atomic(cert, new.pem)
    wait_for(lambda: trusted_by(new_ca), "the data plane to serve the new certificate", 30)
    assert not trusted_by(old_ca)
    ids += reader.read_all().column("id").to_pylist()  # the stream opened before goes on to its end
    open_before.close()
    assert ids == list(range(N))
    # and the Loader, trusting the new CA, reads over the replaced plane
    assert sorted(read_ids([server.target], tls={"ca": str(new_ca.cert)})) == list(range(N))
    assert server.proc.poll() is None


def test_a_frozen_clients_flight_streams_are_reaped(servers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The write timeout on the Flight plane: the connection is shut down, slots and bytes come back."""
    server = servers.start(metrics=True, extra_args=("--write-timeout", "1"))
    blobs = pb.ReadRequest(dataset="blobs@1", world_size=1, batch_size=4, max_message_bytes=256 << 10)
    client = stalled_process(server.target, blobs, 5, tmp_path)
    try:
        assert (tmp_path / "stalled.ready").read_text().split() == ["OK"] * 5
        os.kill(client.pid, signal.SIGSTOP)
        wait_for(
            lambda: scrape(server)["shardstream_streams_active"] == 0, "the frozen client's streams to end"
        )
        metrics = scrape(server)
        assert metrics["shardstream_stream_buffer_bytes"] == 0
        assert metrics["shardstream_streams_reaped_total"] == 5
        assert sorted(read_ids([server.target])) == list(range(N))  # and the server serves on
    finally:
        os.killpg(client.pid, signal.SIGKILL)
        client.wait()


def test_a_dns_name_streams_from_the_address_that_answered_and_fails_over_to_the_next(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dns:///name:port (a headless Service): each stream asks one address of the name for its data
    port (and grant) and dials that address; after a failure, the next address."""
    with LocalServer(root, metrics=True) as a:
        port = a.port
        with LocalServer(root, extra_args=("--host", "127.0.0.2", "--port", str(port))) as b:
            real = socket.getaddrinfo

            def two_addresses(host, *args, **kwargs):  # type: ignore[no-untyped-def]
                if host == "fleet.invalid":
                    return [
                        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
                        for ip in ("127.0.0.1", "127.0.0.2")
                    ]
                return real(host, *args, **kwargs)

            monkeypatch.setattr(socket, "getaddrinfo", two_addresses)
            c = Connection(f"dns:///fleet.invalid:{port}")
            request = pb.ReadRequest(dataset="toy@1", batch_size=100, world_size=1)
            try:
                for _ in range(3):  # a, b, a: each stream from the address that named its data port
                    assert sum(batch.num_rows for _, batch in c.read(request)) == N
                    c.forget_data_port()  # as after a broken stream
                assert scrape(a)["shardstream_rows_sent_total"] == 2 * N  # the other stream was b's
                b.kill()
                with pytest.raises(UnavailableError, match="UNAVAILABLE"):  # b's turn: gone
                    list(c.read(request))
                assert sum(batch.num_rows for _, batch in c.read(request)) == N  # the next address: a
            finally:
                c.close()
            assert scrape(a)["shardstream_rows_sent_total"] == 3 * N


def test_a_streams_metrics_count_it_while_it_runs_and_all_of_it_when_it_ends(servers) -> None:  # type: ignore[no-untyped-def]
    """The send loop counts its messages in the metrics every 16 messages (or second), not one at
    a time, and the rest when the stream ends: nothing is lost or counted twice."""
    server = servers.start(metrics=True)
    c = Connection(server.target)
    request = pb.ReadRequest(dataset="toy@1", batch_size=7, world_size=1, max_message_bytes=1)  # a step a message
    try:
        before = scrape(server)
        stream = iter(c.read(request))
        got = [next(stream) for _ in range(40)]
        mid = scrape(server)
        assert mid["shardstream_messages_sent_total"] - before["shardstream_messages_sent_total"] >= 32
        got += list(stream)
    finally:
        c.close()
    after = scrape(server)
    assert sum(batch.num_rows for _, batch in got) == N
    assert after["shardstream_messages_sent_total"] - before["shardstream_messages_sent_total"] == len(got)
    assert after["shardstream_rows_sent_total"] - before["shardstream_rows_sent_total"] == N
    assert after["shardstream_batches_sent_total"] - before["shardstream_batches_sent_total"] == -(-N // 7)
    sent = after["shardstream_bytes_sent_total"] - before["shardstream_bytes_sent_total"]
    assert sent >= sum(batch.nbytes for _, batch in got)
