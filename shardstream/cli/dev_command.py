"""`shardstream dev PATH`: everything under PATH served on this machine, in one command.

Every JSON Lines or Parquet file under PATH becomes a dataset named after the file, and every image
folder (DIR/<class>/<image>) one named after DIR; they are ingested into a registry (a temporary one
unless --root says where), served by one `shardstream serve --workers auto` on loopback (the server
the tests and the demo start: server/local_fleet.py; one worker process, more while the trainers
reading from it stall, up to the usable CPUs: worker i's data port is --port + 1 + i) and shown by
`shardstream web` in this process. It prints the endpoint, a Loader snippet for the first dataset and
the web URL, and stops everything on Ctrl-C (SIGINT) or SIGTERM: the web viewer, the server's process
group, the temporary registry.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from shardstream.errors import InvalidArgumentError, ShardstreamError

from . import common

__all__ = ["add_commands", "find_inputs"]

TABLE_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def _hidden(path: Path, top: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(top).parts)


def _name(text: str, taken: set[str]) -> str:
    """A dataset name from a file or folder name (names.py's alphabet), unique among `taken`."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:100] or "data"
    name, k = base, 2
    while name in taken:
        name, k = f"{base}-{k}", k + 1
    taken.add(name)
    return name


def find_inputs(path: Path) -> list[tuple[str, Path, str]]:
    """(dataset name, input, ingest format) for every JSON Lines / Parquet file and image folder
    under `path` (hidden files and folders are left alone), in path order."""
    if not path.exists():
        raise InvalidArgumentError(f"{path}: no such file or directory")
    taken: set[str] = set()
    if path.is_file():
        fmt = TABLE_SUFFIXES.get(path.suffix.lower())
        if fmt is None:
            raise InvalidArgumentError(f"{path}: not JSON Lines or Parquet ({', '.join(TABLE_SUFFIXES)})")
        return [(_name(path.stem, taken), path, fmt)]
    files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p, path))
    # An image folder: DIR/<class>/<image>; DIR is PATH itself or a folder under it.
    image_roots = sorted({p.parent.parent for p in files if p.suffix.lower() in IMAGE_SUFFIXES and p.parent != path})
    found: list[tuple[Path, str]] = [(root, "images") for root in image_roots]
    for p in files:
        fmt = TABLE_SUFFIXES.get(p.suffix.lower())
        if fmt is not None and not any(root in p.parents for root in image_roots):
            found.append((p, fmt))
    if not found:
        raise InvalidArgumentError(
            f"{path}: no JSON Lines or Parquet file and no image folder (DIR/<class>/<image>) under it"
        )
    found.sort(key=lambda item: str(item[0]))
    return [(_name(p.name if fmt == "images" else p.stem, taken), p, fmt) for p, fmt in found]


def _free(port: int, what: str, flag: str) -> int:
    """`port` if nothing listens on it on loopback (0: a free one the OS picks), else one clear line."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise InvalidArgumentError(
                f"port {port} ({what}) is in use on 127.0.0.1: give {flag} N (0 for any free port)"
            ) from None
        return int(s.getsockname()[1])


def _snippet(endpoint: str, ref: str, columns: list[str]) -> str:
    return (
        "from shardstream.client import Loader\n"
        f"with Loader([{endpoint!r}], {ref!r}, batch_size=8, columns={columns!r}) as loader:\n"
        "    for batch in loader:  # dict of numpy arrays\n"
        "        print({k: v.shape for k, v in batch.items()})\n"
        "        break"
    )


def _cmd_dev(args: argparse.Namespace) -> int:
    from shardstream.registry import Registry
    from shardstream.server.local_fleet import LocalServer
    from shardstream.server.serving.cpus import usable_cpus
    from shardstream.server.writing.ingest import IngestOptions, ingest

    if not common_need_web():
        return common.EXIT_ERROR
    inputs = find_inputs(Path(args.path))
    port = _free(args.port, "the server's control port", "--port")
    data_port = _free(args.port + 1, "the server's data port (--port + 1)", "--port") if args.port else 0
    for i in range(1, usable_cpus() if data_port else 0):  # the workers --workers auto may add
        _free(data_port + i, f"worker {i}'s data port (--port + {1 + i})", "--port")
    web_port = _free(args.web_port, "the web viewer", "--web-port")
    temporary = args.dev_root is None
    root = Path(tempfile.mkdtemp(prefix="shardstream-dev-")) if temporary else Path(args.dev_root)
    server = None
    stopping = {"signal": False}

    def stop(signum: int, frame: object) -> None:
        stopping["signal"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        made = []
        for name, src, fmt in inputs:
            try:
                m = ingest(src, name, root, IngestOptions(progress=False), format=fmt)
            except ShardstreamError as exc:
                print(f"shardstream dev: skipped {src}: {exc}", file=sys.stderr, flush=True)
                continue
            made.append((m, src, fmt))
        if not made:
            raise InvalidArgumentError(f"{args.path}: nothing could be ingested (each input's reason is above)")
        server = LocalServer(root, metrics=True, workers="auto")
        server.port, server.data_port = port, data_port
        server.start()
        _serve_web(args, root, server, web_port, made, Registry)
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.stop()
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
    print("shardstream dev: stopped (server and web viewer)", flush=True)
    return 0


def common_need_web() -> bool:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("this command needs the web extra: pip install 'shardstream[web]'", file=sys.stderr)
        return False
    return True


def _serve_web(args: argparse.Namespace, root: Path, server: Any, web_port: int, made: list[Any], registry: Any) -> None:
    import uvicorn

    from shardstream.viz.source import DataSource
    from shardstream.viz.web.web_app import create_app

    endpoint = server.target
    with DataSource(
        [endpoint], registry=registry(root), metrics_urls=[f"http://127.0.0.1:{server.metrics_port}/metrics"]
    ) as source:
        width = max(len(m.ref) for m, _, _ in made)
        lines = [f"shardstream dev: {len(made)} dataset(s) from {args.path}, registry {root}"]
        for m, src, fmt in made:
            lines.append(f"  {m.ref:<{width}}  {m.num_rows:>8,} rows  {fmt:<7}  {src}  columns {', '.join(m.schema.names)}")
        first = made[0][0]
        lines += [
            f"endpoint: {endpoint}   (the control port; data port {server.data_port}, metrics {server.metrics_port})",
            f"web:      http://localhost:{web_port}/",
            "Loader:",
            *("  " + line for line in _snippet(endpoint, first.ref, list(first.schema.names)).splitlines()),
            "Ctrl-C stops the server and the web viewer.",
        ]
        print("\n".join(lines), flush=True)
        uvicorn.run(create_app(source), host="127.0.0.1", port=web_port, log_level="warning")


def add_commands(sub: Any) -> None:
    sp = common.add_command(
        sub,
        "dev",
        _cmd_dev,
        help="serve every JSON Lines / Parquet file and image folder under PATH, with the web viewer",
        description="Ingest every JSON Lines or Parquet file under PATH (one dataset each, named after the file) "
        "and every image folder (DIR/<class>/<image>, one dataset named after DIR) into a registry (temporary "
        "unless --root), start a server and the web viewer on 127.0.0.1, and print the endpoint, a Loader "
        "snippet and the web URL. Ctrl-C stops everything. Needs the server and web extras.",
        epilog=common.examples(
            "shardstream dev ./corpus",
            "shardstream dev data.jsonl",
            "shardstream dev ./data --port 7170 --web-port 8180",
            "shardstream dev ./data --root ./datasets",
        ),
    )
    sp.add_argument("path", metavar="PATH", help="a JSON Lines or Parquet file, or a folder to look through")
    sp.add_argument("--port", type=common.port, default=7070, help="the server's control port (default 7070; data port +1; 0: any)")
    sp.add_argument("--web-port", type=common.port, default=8080, help="the web viewer's port (default 8080; 0: any)")
    sp.add_argument(
        "--root", dest="dev_root", metavar="DIR",
        help="keep the registry in DIR (default: a temporary one, removed on exit)",
    )
