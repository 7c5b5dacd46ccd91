"""What answers at host:port: a shardstream control port, its data port, a metrics port, TLS, or nothing.

A server listens on three ports (`serve --port`, `--data-port`, `--metrics-port`), and clients name
only the first. `probe(target)` says in one line what is there (`shardstream ping` prints it), and
`wrong_port(target, exc)` turns a control-plane call's failure that means "this is not a control
port" into that line (the Loader raises it instead of an empty `InternalError` or a retry loop):

    control    ListDatasets answers: the datasets this caller may read, the data port it names
    auth       the control port wants a token (UNAUTHENTICATED) or refuses this one
    tls        the port speaks TLS and the caller did not ask for it (the certificate's names)
    data       an Arrow Flight server (ListDatasets is UNIMPLEMENTED there): the data plane, with
               the control port that serves it when one answers nearby (below)
    metrics    HTTP/1 with Prometheus text carrying shardstream_ series (and its build version)
    http       another HTTP/1 server;  grpc  another gRPC service
    closed     connection refused;  unreachable  no answer, or a name that does not resolve

A data port's control port is found by asking, in turn, the ports the same local process listens on
(Linux /proc, a server on this host), `data port - 1` (serve's default layout: --data-port = --port
+ 1) and the 15 ports below it (worker i of `--workers N` serves data-port + i); the first that
answers ListDatasets as a shardstream control port is named.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
from dataclasses import dataclass

import grpc
import pyarrow.flight as flight

from shardstream.v1 import shardstream_pb2 as pb

from ..credentials import ChannelSecurity

__all__ = ["PortReport", "VERSION_METADATA", "probe", "wrong_port"]

DEFAULT_TIMEOUT_S = 3.0
NEARBY_TIMEOUT_S = 1.0  # per candidate control port of a data port
NEARBY_PORTS = 16  # data-port - 1 .. data-port - 16 (worker i of --workers N: data-port + i)
SHOWN_DATASETS = 8
VERSION_METADATA = "x-shardstream-version"  # a server's version, when it announces it
_SERVICE = "shardstream.v1.ShardStream"
_NOT_HTTP2 = ("Expected SETTINGS frame", "http1.x", "HTTP/1")


@dataclass(frozen=True)
class PortReport:
    """What answers at `target`: a `kind` (module docstring) and one line saying so."""

    target: str
    kind: str
    line: str
    control: str = ""  # a data port's control port, when one was found

    @property
    def usable(self) -> bool:
        """A control port this caller can read from."""
        return self.kind == "control"


def _split(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def _list(target: str, security: ChannelSecurity, timeout_s: float) -> tuple[pb.ListDatasetsResponse, str]:
    """ListDatasets at `target` (raises grpc.RpcError) and the version the server announced, if any."""
    with security.channel(target, [("grpc.enable_retries", 0)]) as channel:
        call = channel.unary_unary(
            f"/{_SERVICE}/ListDatasets",
            request_serializer=pb.ListDatasetsRequest.SerializeToString,
            response_deserializer=pb.ListDatasetsResponse.FromString,
        )
        resp, state = call.with_call(pb.ListDatasetsRequest(), timeout=timeout_s, metadata=security.metadata or None)
        version = dict(state.initial_metadata() or ()).get(VERSION_METADATA, "")
        return resp, str(version)


def _tls_certificate(host: str, port: int, timeout_s: float) -> tuple[bool, str]:
    """(whether host:port completes a TLS handshake, the names of its certificate)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            with ctx.wrap_socket(sock, server_hostname=host or None) as tls:
                der = tls.getpeercert(binary_form=True)
    except (ssl.SSLError, OSError):
        return False, ""
    return True, _names(der)


def _names(der: bytes | None) -> str:
    if not der:
        return ""
    try:
        from cryptography import x509
        from cryptography.x509.oid import NameOID
    except ImportError:
        return ""
    cert = x509.load_der_x509_certificate(der)
    cn = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        alt = [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
            str(v) for v in san.get_values_for_type(x509.IPAddress)
        ]
    except x509.ExtensionNotFound:
        alt = []
    issuer = [a.value for a in cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)]
    names = ", ".join(dict.fromkeys(map(str, [*cn, *alt])))
    return f"certificate for {names or '?'}, issued by {issuer[0] if issuer else '?'}"


def _http(host: str, port: int, timeout_s: float) -> tuple[str, str]:
    """(status line, body) of GET /metrics over HTTP/1.0; ("", "") when it is not HTTP/1."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(f"GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            chunks, size = [], 0
            while size < 4 << 20:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
                size += len(data)
    except OSError:
        return "", ""
    text = b"".join(chunks).decode("utf-8", "replace")
    head, _, body = text.partition("\r\n\r\n")
    status = head.split("\r\n", 1)[0]
    return (status, body) if status.startswith("HTTP/1") else ("", "")


def _local_ports(port: int) -> list[int]:
    """The other TCP ports the local process that listens on `port` listens on (Linux; [] elsewhere)."""
    listening: dict[str, int] = {}  # socket inode -> port
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A":  # LISTEN
                        listening[parts[9]] = int(parts[1].rpartition(":")[2], 16)
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    inodes = {inode for inode, p in listening.items() if p == port}
    if not inodes:
        return []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        mine = set()
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                mine.add(link[8:-1])
        if mine & inodes:
            return sorted({listening[i] for i in mine if i in listening} - {port})
    return []


def _control_of(host: str, port: int, security: ChannelSecurity) -> str:
    """The control port that serves the data port host:port (module docstring), or ""."""
    local = _local_ports(port) if host in ("127.0.0.1", "localhost", "::1", socket.gethostname()) else []
    nearby = [p for p in range(port - 1, port - 1 - NEARBY_PORTS, -1) if p > 0]
    for candidate in dict.fromkeys([*local, *nearby]):
        target = f"{host}:{candidate}"
        try:
            _list(target, security, NEARBY_TIMEOUT_S)
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                continue
        return target
    return ""


def _is_flight(host: str, port: int, security: ChannelSecurity, timeout_s: float) -> bool:
    """Whether host:port speaks Arrow Flight (any Flight status but UNIMPLEMENTED: a Flight server)."""
    try:
        client = security.flight_client(host, port, [])
    except (flight.FlightError, OSError):
        return False
    try:
        list(client.list_flights(options=flight.FlightCallOptions(timeout=timeout_s)))
        return True
    except NotImplementedError:
        return True  # the Flight server exists; ListFlights is not implemented by it
    except flight.FlightUnavailableError:
        return False
    except flight.FlightError as exc:
        return "UNIMPLEMENTED" not in str(exc) and "Method not found" not in str(exc)
    finally:
        client.close()


def _control_line(target: str, resp: pb.ListDatasetsResponse, version: str) -> str:
    names = sorted(f"{d.name}@{d.version}" for d in resp.datasets)
    shown = ", ".join(names[:SHOWN_DATASETS]) + (f", … ({len(names) - SHOWN_DATASETS} more)" if len(names) > SHOWN_DATASETS else "")
    data_port = getattr(resp, "data_port", 0) or next((d.data_port for d in resp.datasets if d.data_port), 0)
    count = f"{len(names)} dataset{'s' if len(names) != 1 else ''} visible to this caller"
    return (
        f"{target}: shardstream control port ({f'server {version}' if version else 'protocol shardstream.v1'}); "
        f"{count}{': ' + shown if names else ''}{f'; data port {data_port}' if data_port else ''}"
    )


def probe(target: str, security: ChannelSecurity | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> PortReport:
    """What answers at `target` ('host:port'), in one line (module docstring)."""
    security = security or ChannelSecurity()
    host, port = _split(target)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return PortReport(target, "closed", f"{target}: nothing listens there (connection refused)")
    except socket.gaierror as exc:
        return PortReport(target, "unreachable", f"{target}: cannot resolve {host!r} ({exc.strerror})")
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        return PortReport(target, "unreachable", f"{target}: {why} within {timeout_s:g} s (a firewall, or no such host)")
    tls, names = _tls_certificate(host, port, timeout_s)
    if tls and not security.tls:
        return PortReport(
            target, "tls",
            f"{target}: TLS required ({names or 'a TLS server'}): ping it with --tls-ca CA.pem "
            "(or --tls for a certificate from a public CA), and give the Loader tls=...",
        )
    note = ""
    if security.tls and not tls:
        note = " (it speaks plaintext: no TLS needed)"
        security = ChannelSecurity(metadata=security.metadata)
    try:
        resp, version = _list(target, security, timeout_s)
        return PortReport(target, "control", _control_line(target, resp, version) + note)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNAUTHENTICATED:
        given = "refuses this caller's token" if security.metadata else "requires a token (serve --auth)"
        hint = "" if security.metadata else ": ping it with --token-file FILE (or $SHARDSTREAM_TOKEN)"
        return PortReport(target, "auth", f"{target}: shardstream control port; auth required: it {given}{hint}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PortReport(target, "auth", f"{target}: shardstream control port; auth: {details}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        if _is_flight(host, port, security, timeout_s):
            control = _control_of(host, port, security)
            use = (
                f"give clients {control}, its control port"
                if control
                else f"give clients the server's control port (`serve --port`; none answers at {host}:{port - 1}, "
                "where serve puts it by default)"
            )
            return PortReport(
                target, "data", f"{target}: shardstream data port (Arrow Flight streams), not a control port: {use}",
                control,
            )
        return PortReport(target, "grpc", f"{target}: a gRPC server without the shardstream service")
    if code == grpc.StatusCode.UNAVAILABLE and any(s in details for s in _NOT_HTTP2):
        status, body = _http(host, port, timeout_s)
        if "shardstream_" in body or "grpc_server_started_total" in body:
            found = re.search(r'shardstream_build_info\{[^}]*version="([^"]+)"', body)
            version = f", server {found.group(1)}" if found else ""
            return PortReport(
                target, "metrics",
                f"{target}: shardstream metrics port (Prometheus /metrics{version}), not a control port: give "
                "clients the server's --port (7070 unless serve was told otherwise)",
            )
        return PortReport(target, "http", f"{target}: an HTTP server ({status or 'not HTTP/2'}), not shardstream")
    return PortReport(target, "unknown", f"{target}: no shardstream control port ({code.name}: {details})")


def wrong_port(target: str, exc: grpc.RpcError, security: ChannelSecurity | None = None) -> str | None:
    """For a control-plane call to `target` that failed with `exc`: the line saying what answers
    there instead, when the failure means it is not a control port (None otherwise)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    not_http2 = code == grpc.StatusCode.UNAVAILABLE and any(s in details for s in _NOT_HTTP2)
    if code != grpc.StatusCode.UNIMPLEMENTED and not not_http2:
        return None
    if target.startswith("dns:"):
        what = "an HTTP/1 server (a metrics port?)" if not_http2 else "a gRPC server without the shardstream service"
        return f"{target} is not a shardstream control port: {what} answers there; give the server's --port"
    report = probe(target, security)
    if report.kind in ("control", "auth"):  # it answers now: the failure was something else
        return None
    return report.line
