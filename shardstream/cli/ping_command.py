"""`shardstream ping HOST:PORT`: what answers there, in one line per address (client/transport/port_probe.py).

A control port (its datasets visible to this caller and its data port), a data port (and the
control port to give clients instead), a metrics port, TLS or a token required, or nothing. Exit 0
only when every address is a control port this caller can read from.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from shardstream.errors import InvalidArgumentError

from . import common

__all__ = ["add_commands"]


def _cmd_ping(args: argparse.Namespace) -> int:
    from shardstream.client.credentials import ChannelSecurity
    from shardstream.client.transport.channel import normalize_endpoints
    from shardstream.client.transport.port_probe import probe

    targets = normalize_endpoints(list(args.targets))
    if any(t.startswith("dns:") for t in targets):
        raise InvalidArgumentError("ping takes HOST:PORT (one address); for a dns:/// name, ping each address")
    security = ChannelSecurity.from_options(**common.client_security(args))
    reports = [probe(t, security, args.timeout) for t in targets]
    if args.json:
        print(json.dumps([{"target": r.target, "kind": r.kind, "usable": r.usable, "control": r.control or None,
                           "line": r.line} for r in reports], indent=1))
    else:
        for r in reports:
            print(r.line)
    return 0 if all(r.usable for r in reports) else common.EXIT_ERROR


def add_commands(sub: Any) -> None:
    sp = common.add_command(
        sub,
        "ping",
        _cmd_ping,
        help="say what answers at HOST:PORT (control, data or metrics port, TLS, auth, nothing)",
        description="Connect to each HOST:PORT and say in one line what answers there: a shardstream control "
        "port (the datasets this caller may read, its data port), a data port (and the control port to give "
        "clients instead), a metrics port, a port that requires TLS or a token, another server, or nothing. "
        "Exit 0 only when every address is a control port this caller can read from.",
        epilog=common.examples(
            "shardstream ping 127.0.0.1:7070",
            "shardstream ping 10.0.0.5:7070 10.0.0.5:7071 10.0.0.5:9090",
            "shardstream ping srv-a:7070 --tls-ca ca.crt --token-file token.txt",
            "shardstream ping 127.0.0.1:7070 --json",
        ),
    )
    sp.add_argument("targets", nargs="+", metavar="HOST:PORT", help="address(es) to ask")
    sp.add_argument("--timeout", type=common.timeout_seconds, default=3.0, help="seconds to wait for each answer (default 3)")
    common.json_option(sp)
    common.client_security_options(sp)
