"""One server of the fleet: its control channel, its data plane's Flight client, the options of both.

A `Connection` takes its TLS credentials and bearer token from a `ChannelSecurity`
(credentials.py); the token rides on every call as metadata. The server names the port of its
data plane in its GetDataset answers (a Read's discovery) and its ListDatasets answers (a
checkpoint call's): Read streams and checkpoint calls are Arrow Flight calls on the same host
(`data_plane()`), over one Flight client built with FLIGHT_OPTIONS, with the same credentials, token
and keepalive (and the grant it gave a caller it knew by a client certificate, asked again before it
runs out, with the proof that the certificate is this client's: credentials.py, `DataPlane.options`).
Every call raises the project's own errors (shardstream/errors.py); a Read is a `flight_call.ReadCall`.

Retries: one layer, the caller's `RetryPolicy` (spec.py) counted by `retry.Attempts` — a stream
session's (session.py), discovery's and a checkpoint call's (fleet.py), with its backoff and budget. gRPC keeps only what it alone can do:
round-robin load balancing over the addresses of a dns:/// name (skipping those that are down), and
its transparent retry of a call that never left this client (`grpc.enable_retries`: only gRPC knows
the server never saw it). It has no retryPolicy of its own (the service config's methodConfig is
gone), so a GetDataset that fails UNAVAILABLE reaches the RetryPolicy at once, not after gRPC's
hidden attempts and backoff.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import grpc
import pyarrow.flight as flight

from shardstream import allocator
from shardstream.errors import InvalidArgumentError, from_grpc_error, status_error
from shardstream.v1 import shardstream_pb2 as pb

from ..credentials import ChannelSecurity
from .flight_call import FlightCall, ReadCall
from .port_probe import wrong_port

__all__ = ["CHANNEL_OPTIONS", "FLIGHT_OPTIONS", "Connection", "DataPlane", "normalize_endpoints"]

_SERVICE = "shardstream.v1.ShardStream"

# Only load balancing (see the module docstring): no methodConfig retryPolicy — the RetryPolicy retries.
_SERVICE_CONFIG = json.dumps(
    {
        # A dns:/// target that resolves to several servers (a Kubernetes headless service) spreads
        # calls over all of them and skips the ones that are down.
        "loadBalancingConfig": [{"round_robin": {}}],
    }
)

CHANNEL_OPTIONS = [
    # Batches can be large (several steps per message); the server bounds them, not the client.
    ("grpc.max_receive_message_length", -1),
    # Keepalive: ping every 10 s, give up after 5 s without an answer, so a silent server is
    # noticed instead of hanging a stream forever (off by default in gRPC). The control port allows
    # it: its server accepts a ping every 5 s, also without calls (server/lifecycle.py, SERVER_OPTIONS).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # ... which grpcio 1.85 does not apply to the ping: an unanswered ping ends the connection after
    # ping_timeout_ms (60 s by default). A blackholed server went unnoticed for 60 s (loadtest.chaos).
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 1),  # transparent retries only: no retryPolicy in the service config
    ("grpc.service_config", _SERVICE_CONFIG),
    # A channel of its own connections: gRPC shares subchannels between channels of one process with
    # the same target and options, so a new Loader would inherit another's reconnect backoff to a
    # server that just restarted and fail UNAVAILABLE at once instead of connecting.
    ("grpc.use_local_subchannel_pool", 1),
]


# The Flight data plane's channel — of every Read stream and every checkpoint call (Connection.data_plane):
# the same keepalive time and timeouts as CHANNEL_OPTIONS (a silent server is noticed), within what its
# server allows. pyarrow's Flight server takes no gRPC server options, so it polices pings with gRPC's
# defaults: while it sends nothing, a ping sooner than 5 min after the last
# (grpc.http2.min_ping_interval_without_data_ms 300000) is a strike, on a connection without calls any
# ping is (grpc.keepalive_permit_without_calls 0), and the third strike (grpc.http2.max_ping_strikes 2)
# ends the connection: GOAWAY ENHANCE_YOUR_CALM "too_many_pings", with the streams on it. Pinging every
# 10 s regardless, a Loader whose training step outlasted 40 s (its prefetch queue full, the stream
# waiting) lost its stream that way (tests/test_keepalive.py).
FLIGHT_OPTIONS = [
    # Ping every 10 s while a call is open, and give up after 5 s without an answer ...
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # ... which grpcio 1.85 does not apply to the ping: an unanswered ping ends the connection after
    # ping_timeout_ms (60 s by default). Without it a blackholed server went unnoticed for 60 s.
    ("grpc.http2.ping_timeout_ms", 5_000),
    # No pings on a connection without calls (a strike at the Flight server)...
    ("grpc.keepalive_permit_without_calls", 0),
    # ... and one ping per frame this client sends (a window update as the loop reads on, a new call):
    # the server's first ping after it sent anything is never a strike, so a pause of any length costs none.
    ("grpc.http2.max_pings_without_data", 1),
]
DISCOVERY_TIMEOUT_S = 10.0  # the GetDataset that tells a stream's first call the server's data port
GRANT_MARGIN_S = 60.0  # a grant is asked for again this long before it runs out


def _host_of(target: str) -> str:
    """The host of `host:port` or `dns:///host:port` (an IPv6 address keeps its brackets)."""
    e = target.split("/", 3)[-1] if target.startswith("dns://") else target.removeprefix("dns:")
    return e.rpartition(":")[0]


def normalize_endpoints(endpoints: str | list[str] | tuple[str, ...]) -> list[str]:
    """`host:port` or `dns:///host:port` strings, validated (a comma-separated string is accepted too)."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out = [e.strip() for e in items if isinstance(e, str) and e.strip()]
    if not out or len(out) != len(items):
        raise InvalidArgumentError(
            f"endpoints must be a non-empty list of 'host:port' strings, got {endpoints!r}"
        )
    for given in out:
        e = given
        if e.startswith("dns:"):  # dns:///host:port — every address the name resolves to
            e = e.split("/", 3)[-1] if e.startswith("dns://") else e.removeprefix("dns:")
        elif "://" in e:
            scheme, _, rest = e.partition("://")
            raise InvalidArgumentError(
                f"endpoint {given!r} has a scheme ({scheme}://): shardstream speaks gRPC to 'host:port' "
                f"(e.g. {rest.rstrip('/')!r}), or 'dns:///host:port' for every address of a name"
            )
        host, sep, port = e.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgumentError(
                f"endpoint {given!r} is not 'host:port' (the port is required: `shardstream serve` uses 7070 "
                "unless --port says otherwise)"
            )
    return out


class Connection:
    """One channel to one server (the control plane) and its data plane: the three calls the client makes."""

    def __init__(self, target: str, security: ChannelSecurity | None = None) -> None:
        allocator.tune()  # received messages are multi-MiB bytes: keep their pages in the heap
        self.target = target
        security = security or ChannelSecurity()
        self._security = security
        self._metadata = security.metadata or None  # the bearer token, on every call
        # The Flight data plane, once a GetDataset answer named its port (None: not asked yet). A
        # dns:/// target's streams go to one address of the name at a time (the next one after a
        # failure): the one whose GetDataset named the port, and its grant, is the one dialled — a
        # Loader's own GetDataset (get_dataset) included, so its first stream asks no second one.
        self._host, self._port = _host_of(target), int(target.rpartition(":")[2])
        self._dns = target.startswith("dns:")
        self._data_host = self._host
        self._picks = 0
        self._data_port: int | None = None
        self._flight: Any = None
        self._flight_lock = threading.Lock()
        self._flight_call_headers = [(k.encode(), v.encode()) for k, v in security.metadata]
        self._grant = b""  # the server's word for a certificate's principal (GetDataset's data_grant)
        self._grant_until = 0.0
        self._channel = security.channel(target, CHANNEL_OPTIONS)
        self._get = self._channel.unary_unary(
            f"/{_SERVICE}/GetDataset",
            request_serializer=pb.GetDatasetRequest.SerializeToString,
            response_deserializer=pb.DatasetInfo.FromString,
        )
        self._list = self._channel.unary_unary(
            f"/{_SERVICE}/ListDatasets",
            request_serializer=pb.ListDatasetsRequest.SerializeToString,
            response_deserializer=pb.ListDatasetsResponse.FromString,
        )

    def get_dataset(self, dataset: str, timeout_s: float) -> pb.DatasetInfo:
        """GetDataset; the answering server's data plane is remembered, so the next Read dials it
        without asking again. A dns:/// name's is asked of one address of the name (the next one
        when an address does not answer, each at most once): the address the Read then dials."""
        request = pb.GetDatasetRequest(dataset=dataset)
        try:
            if self._dns:
                return self._ask_any_address(request, timeout_s)
            info = self._get(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._error(exc) from exc
        self._remember(info, self._host)
        return info

    def _ask_any_address(self, request: pb.GetDatasetRequest, timeout_s: float) -> pb.DatasetInfo:
        """GetDataset of the name's addresses in turn until one answers or says other than
        UNAVAILABLE (as the round-robin channel skips the addresses that are down)."""
        tried = 0
        while True:
            address, count = self._next_address()
            tried += 1
            try:
                info, _ = self._ask_address(address, "GetDataset", request, pb.DatasetInfo, timeout_s)
                return info  # type: ignore[no-any-return]
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or tried >= count:
                    raise

    def list_datasets(self, timeout_s: float) -> pb.ListDatasetsResponse:
        try:
            return self._list(pb.ListDatasetsRequest(), timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._error(exc) from exc

    def _error(self, exc: grpc.RpcError) -> Exception:
        """The error of a failed control-plane call: one saying what answers at the target instead when
        it is not a control port (a data or metrics port: port_probe.py), else the mapped status."""
        wrong = wrong_port(self.target, exc, self._security)
        return InvalidArgumentError(wrong) if wrong else from_grpc_error(exc, target=self.target)

    def read(self, request: pb.ReadRequest, timeout_s: float | None = None) -> ReadCall:
        """A Read stream: a Flight DoGet on the server's data plane (its port from GetDataset), an
        iterator of (header, rows) that can be cancelled; `timeout_s`: a deadline for the whole
        stream (None: none; the Loader's streams have none, its idle watchdog ends a silent one)."""
        name = request.dataset or (request.mixture[0].dataset if request.mixture else "")
        plane = self.data_plane(name)
        ticket = request.SerializeToString()  # the proof of a grant signs these very bytes
        options = plane.options(ticket, timeout_s)
        return FlightCall(plane.client, ticket, options, self.forget_data_port, target=self.target)

    def data_plane(self, dataset: str | None) -> DataPlane:
        """The server's data plane: its Flight client (one per server, FLIGHT_OPTIONS) and this
        caller's grant there. Asked for first when not known yet or when the grant runs out:
        GetDataset(`dataset`) for a Read, ListDatasets (`dataset` None) for a checkpoint call. A
        failure is the ShardstreamError a call would raise: the caller's RetryPolicy retries it as one."""
        data_port = self._data_port
        stale_grant = self._grant and time.monotonic() > self._grant_until - GRANT_MARGIN_S
        if data_port is None or stale_grant:  # not asked yet (or its grant runs out)
            data_port = self._discover(dataset)
        if not data_port:  # a server from before the Flight data plane
            raise status_error(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the server at {self.target} names no data port: it predates this client (upgrade the fleet)",
            )
        with self._flight_lock:
            if self._flight is None:
                self._flight = self._security.flight_client(
                    self._data_host,
                    data_port,
                    FLIGHT_OPTIONS,
                    server_name=self._host if self._dns else None,
                )
            return DataPlane(self._flight, f"{self._data_host}:{data_port}", self._grant, self)

    def _discover(self, dataset: str | None) -> int:
        """GetDataset (or ListDatasets) from the server the next call will dial; its data port."""
        request: pb.GetDatasetRequest | pb.ListDatasetsRequest
        if dataset is None:
            method, request, answer = "ListDatasets", pb.ListDatasetsRequest(data_plane_only=True), pb.ListDatasetsResponse
        else:
            method, request, answer = "GetDataset", pb.GetDatasetRequest(dataset=dataset), pb.DatasetInfo
        try:
            return self._discover_once(method, request, answer)
        except grpc.RpcError as exc:
            # a checkpoint call's says what answers there when it is no control port, as ListDatasets does
            raise (self._error(exc) if dataset is None else from_grpc_error(exc, target=self.target)) from exc

    def _discover_once(self, method: str, request: Any, answer: Any) -> int:
        if not self._dns:
            call = self._get if method == "GetDataset" else self._list
            info = call(request, timeout=DISCOVERY_TIMEOUT_S, metadata=self._metadata)
            return self._remember(info, self._host)
        address, _ = self._next_address()
        return self._ask_address(address, method, request, answer, DISCOVERY_TIMEOUT_S)[1]

    def _ask_address(self, address: str, method: str, request: Any, answer: Any, timeout_s: float) -> tuple[Any, int]:
        """`method` of one address of a dns:/// name, on a channel of its own; the answer and the data
        port it names, remembered with that address."""
        options = list(CHANNEL_OPTIONS)
        if self._security.tls and not self._security.server_name:  # the certificate names the name
            options.append(("grpc.ssl_target_name_override", self._host))
        channel = self._security.channel(f"{address}:{self._port}", options)
        try:
            get = channel.unary_unary(
                f"/{_SERVICE}/{method}",
                request_serializer=type(request).SerializeToString,
                response_deserializer=answer.FromString,
            )
            info = get(request, timeout=timeout_s, metadata=self._metadata)
        finally:
            channel.close()
        return info, self._remember(info, address)

    def _next_address(self) -> tuple[str, int]:
        """The next address of a dns:/// target's name, in turn (resolved anew each time), and how
        many addresses the name has."""
        try:
            infos = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise status_error(grpc.StatusCode.UNAVAILABLE, f"cannot resolve {self._host}: {exc.strerror}") from exc
        addresses = list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in infos))
        address = addresses[self._picks % len(addresses)]
        self._picks += 1
        return (f"[{address}]" if ":" in address else address), len(addresses)

    def _remember(self, info: pb.DatasetInfo | pb.ListDatasetsResponse, host: str) -> int:
        """The data plane a GetDataset (or ListDatasets) answer names: its host and port, and the
        caller's grant there; the port."""
        data_port = info.data_port
        if not data_port and isinstance(info, pb.ListDatasetsResponse) and info.datasets:
            data_port = info.datasets[0].data_port  # a server that named it per dataset only
        with self._flight_lock:
            if (host, data_port) != (self._data_host, self._data_port):
                self._flight = None  # another server: a client of its own (the old one is let go)
            self._data_host = host
            self._data_port = data_port
            self._grant = info.data_grant
            self._grant_until = time.monotonic() + info.data_grant_ttl_s
        return data_port

    def forget_data_port(self) -> None:
        """Ask the server for its data port again before the next stream (it may have restarted)."""
        with self._flight_lock:  # not closed: another stream of this connection may still read on it
            self._flight = None
            self._data_port = None
            self._grant = b""

    def close(self) -> None:
        with self._flight_lock:  # let go, not closed: a stream still reading on it keeps it (flight_call.py)
            self._flight = None
        self._channel.close()


@dataclass(frozen=True)
class DataPlane:
    """A server's Flight data plane as one call finds it: the client, where it goes, the caller's grant."""

    client: flight.FlightClient
    target: str  # host:port of the data plane
    grant: bytes  # "" unless the server knew this caller by its client certificate
    conn: Connection

    def options(self, signed: bytes, timeout_s: float | None) -> flight.FlightCallOptions:
        """A call's options: the token; or the grant with the proof over `signed` (what the call
        asks: a Read's ticket, checkpoint_format.signed_bytes) that this client holds the certificate
        the grant names; and its deadline (None: none)."""
        headers = self.conn._flight_call_headers
        if self.grant:  # the data plane cannot see the certificate
            headers = [*headers, *self.conn._security.grant_headers(self.grant, signed)]
        return flight.FlightCallOptions(headers=headers, timeout=timeout_s)
