"""A server's ports, checked free before anything binds them, and held for a supervisor's workers.

`reserve_port` is the one place a port is checked: a single server checks its control and data ports
before gRPC and Flight bind them (one clear line instead of theirs), and a supervisor (supervisor.py)
checks its control port once without SO_REUSEPORT — a listener of anyone else makes that fail — then
holds a non-listening SO_REUSEPORT socket on it for its whole life, so nothing without SO_REUSEPORT
can take it while its workers start or restart. Port 0 is resolved there, once.
"""

from __future__ import annotations

import errno
import socket

from shardstream.errors import InvalidArgumentError

__all__ = ["reserve_port"]


def reserve_port(host: str, port: int, *, hold: bool = True) -> tuple[int, list[socket.socket]]:
    """Check that `host:port` is free and (`hold`) hold it for workers that bind it with SO_REUSEPORT.

    Returns the port (chosen here when 0) and the held sockets (close them to release it).
    """
    where = f"{host}:{port}"
    try:
        name = host.strip("[]") or None  # "[::]" as grpc takes it
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InvalidArgumentError(f"cannot listen on {where}: {exc.strerror}") from exc
    held: list[socket.socket] = []
    seen = set()
    try:
        for family, _, _, _, sockaddr in infos:
            if (family, sockaddr[0]) in seen:
                continue
            seen.add((family, sockaddr[0]))
            addr = (sockaddr[0], port, *sockaddr[2:])
            # 1. The probe: anyone listening there (or holding it without SO_REUSEADDR) makes this fail.
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no owner
                try:
                    probe.bind(addr)
                except OSError as exc:
                    raise InvalidArgumentError(
                        f"cannot listen on {where}: {exc.strerror} (is the port in use?)"
                    ) from exc
                port = probe.getsockname()[1]
            if hold:
                held.append(_hold(family, (sockaddr[0], port, *sockaddr[2:]), f"{host}:{port}"))
    except BaseException:
        for s in held:
            s.close()
        raise
    return port, held


def _hold(family: int, addr: tuple[object, ...], where: str) -> socket.socket:
    """A socket bound to `addr`, never listening (it gets no connections), beside which only
    SO_REUSEPORT sockets of this user may bind. Without SO_REUSEADDR, another server's probe fails on
    it too; but connections in TIME_WAIT left by a server without SO_REUSEPORT (a killed single
    process) refuse such a bind, so then it takes SO_REUSEADDR (the probe above still saw no listener).
    """
    for reuse_addr in (False, True):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if reuse_addr:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
            return s
        except OSError as exc:
            s.close()
            if reuse_addr or exc.errno != errno.EADDRINUSE:
                raise InvalidArgumentError(
                    f"cannot listen on {where}: {exc.strerror} (is the port in use?)"
                ) from exc
    raise AssertionError("unreachable")
