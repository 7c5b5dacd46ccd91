"""gRPC channels to shardstream servers: options, retries and the stub calls, in one place.

A `Connection` takes its TLS credentials and bearer token from a `ChannelSecurity`
(credentials.py); the token rides on every call as metadata. A server with an Arrow Flight data
plane names its port in its GetDataset answers: that connection's Read streams are then Flight
DoGets on the same host (flight_call.py), with the same credentials, token and keepalive.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pyarrow.flight as flight

from shardstream import allocator
from shardstream.errors import InvalidArgumentError, from_grpc_error
from shardstream.framing import decode_read_response
from shardstream.v1 import shardstream_pb2 as pb

from .credentials import ChannelSecurity
from .flight_call import FlightCall, HeaderCapture

__all__ = ["Connection", "normalize_endpoints"]

_SERVICE = "shardstream.v1.ShardStream"

# Unary control-plane calls are retried by gRPC itself on UNAVAILABLE. Streams are never retried by
# gRPC once headers arrive: the Loader resumes them from its cursor instead.
_SERVICE_CONFIG = json.dumps(
    {
        # A dns:/// target that resolves to several servers (a Kubernetes headless service) spreads
        # calls over all of them and skips the ones that are down.
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [
            {
                "name": [
                    {"service": _SERVICE, "method": "GetDataset"},
                    {"service": _SERVICE, "method": "ListDatasets"},
                ],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
    }
)

CHANNEL_OPTIONS = [
    # Batches can be large (several steps per message); the server bounds them, not the client.
    ("grpc.max_receive_message_length", -1),
    # Keepalive: ping every 10 s, give up after 5 s without an answer, so a silent server is
    # noticed instead of hanging a stream forever (off by default in gRPC).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # ... which grpcio 1.85 does not apply to the ping: an unanswered ping ends the connection after
    # ping_timeout_ms (60 s by default). A blackholed server went unnoticed for 60 s (loadtest.chaos).
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", _SERVICE_CONFIG),
    # A channel of its own connections: gRPC shares subchannels between channels of one process with
    # the same target and options, so a new Loader would inherit another's reconnect backoff to a
    # server that just restarted and fail UNAVAILABLE at once instead of connecting.
    ("grpc.use_local_subchannel_pool", 1),
]


# The Flight data plane's channel: the same keepalive as CHANNEL_OPTIONS (a silent server is noticed)
FLIGHT_OPTIONS = [(k, v) for k, v in CHANNEL_OPTIONS if k.startswith(("grpc.keepalive", "grpc.http2"))]
DISCOVERY_TIMEOUT_S = 10.0  # the GetDataset that tells a stream's first call the server's data port
GRANT_HEADER = b"x-shardstream-grant"  # a certificate principal's grant, on DoGet (server/grants.py)
GRANT_MARGIN_S = 60.0  # a grant is asked for again this long before it runs out


def _host_of(target: str) -> str:
    """The host of `host:port` or `dns:///host:port` (brackets of an IPv6 address removed)."""
    e = target.split("/", 3)[-1] if target.startswith("dns://") else target.removeprefix("dns:")
    return e.rpartition(":")[0].strip("[]")


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
    """One channel to one server, with the three calls the client makes."""

    def __init__(self, target: str, security: ChannelSecurity | None = None) -> None:
        allocator.tune()  # received messages are multi-MiB bytes: keep their pages in the heap
        self.target = target
        security = security or ChannelSecurity()
        self._security = security
        self._metadata = security.metadata or None  # the bearer token, on every call
        # The Flight data plane, once a GetDataset answer named its port (None: not asked yet)
        self._host = _host_of(target)
        self._data_port: int | None = None
        self._flight: Any = None
        self._flight_lock = threading.Lock()
        self._flight_headers = HeaderCapture()
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
        # Read messages are hand-framed: the Arrow payload is a view of the received bytes.
        self._read = self._channel.unary_stream(
            f"/{_SERVICE}/Read",
            request_serializer=pb.ReadRequest.SerializeToString,
            response_deserializer=decode_read_response,
        )

    def get_dataset(self, dataset: str, timeout_s: float) -> pb.DatasetInfo:
        try:
            info = self._get(pb.GetDatasetRequest(dataset=dataset), timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise from_grpc_error(exc, target=self.target) from exc
        self._remember(info)
        return info

    def list_datasets(self, timeout_s: float) -> pb.ListDatasetsResponse:
        try:
            return self._list(pb.ListDatasetsRequest(), timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise from_grpc_error(exc, target=self.target) from exc

    def read(self, request: pb.ReadRequest, timeout_s: float | None = None) -> Iterator:  # type: ignore[type-arg]
        """The raw call: an iterator of (header, payload or rows) that can be cancelled — a Flight
        DoGet on the server's data plane when it has one (GetDataset says so), else a grpcio Read."""
        data_port = self._data_port
        stale_grant = self._grant and time.monotonic() > self._grant_until - GRANT_MARGIN_S
        if data_port is None or stale_grant:  # not asked yet (or its grant runs out): GetDataset
            # (a failure is the grpc.RpcError a Read would raise: the session retries it as one)
            name = request.dataset or (request.mixture[0].dataset if request.mixture else "")
            info = self._get(
                pb.GetDatasetRequest(dataset=name), timeout=DISCOVERY_TIMEOUT_S, metadata=self._metadata
            )
            self._remember(info)
            data_port = info.data_port
        if not data_port:
            return self._read(request, timeout=timeout_s, metadata=self._metadata)
        with self._flight_lock:
            if self._flight is None:
                self._flight = self._security.flight_client(
                    self._host, data_port, FLIGHT_OPTIONS, [self._flight_headers]
                )
            client = self._flight
            headers = self._flight_call_headers
            if self._grant:
                headers = [*headers, (GRANT_HEADER, self._grant)]
        options = flight.FlightCallOptions(headers=headers)
        return FlightCall(client, self._flight_headers, request, options, self.forget_data_port)

    def _remember(self, info: pb.DatasetInfo) -> None:
        """The data plane a GetDataset answer names: its port, and the caller's grant there."""
        with self._flight_lock:
            self._data_port = info.data_port
            self._grant = info.data_grant
            self._grant_until = time.monotonic() + info.data_grant_ttl_s

    def forget_data_port(self) -> None:
        """Ask the server for its data port again before the next stream (it may have restarted)."""
        with self._flight_lock:  # not closed: another stream of this connection may still read on it
            self._flight = None
            self._data_port = None
            self._grant = b""

    def close(self) -> None:
        with self._flight_lock:
            if self._flight is not None:
                self._flight.close()
                self._flight = None
        self._channel.close()
