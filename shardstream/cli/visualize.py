"""`shardstream view` (terminal) and `shardstream web` (browser): data as a rank receives it.

Both read through servers: `--server HOST:PORT[,...]` dials a running fleet; without it, a server
is started over `--root` for the session and stopped at the end. A registry root, when there is
one, adds history, diffs, shard names and the shuffle-quality plot. The positional DATASET (and the
plan options) open the step browser directly.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from . import common

__all__ = ["add_commands"]

WEB_EXTRA_HINT = "this command needs the {extra} extra: pip install 'shardstream[{extra}]'"


def _need(module: str, extra: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        print(WEB_EXTRA_HINT.format(extra=extra), file=sys.stderr)
        return False
    return True


def _source(args: argparse.Namespace) -> Any:
    from shardstream.viz.source import DataSource

    local = not args.root.startswith("s3://")
    registry = common.open_registry(args) if (not local or Path(args.root).is_dir()) else None
    if not args.server and registry is None:
        common.open_registry(args)  # the one-line error naming the missing root
    return DataSource.open(
        server=args.server,
        root=None if args.server else args.root,
        registry=registry,
        metrics=args.metrics or (),
        **common.client_security(args),
    )


def _reachable(source: Any) -> None:
    """Ask the fleet for its datasets once before any UI starts: an unreachable server, a data or
    metrics port, TLS or a token missing is one line and exit 1 (not a UI that fails inside)."""
    from shardstream.client.transport.port_probe import probe
    from shardstream.errors import UnavailableError

    try:
        source.list_datasets()
    except UnavailableError as exc:
        said = [probe(e, source.security).line for e in source.endpoints if not e.startswith("dns:")]
        if not said:
            raise
        raise UnavailableError(f"no shardstream server reachable: {'; '.join(said)}") from exc


def _start(args: argparse.Namespace, source: Any) -> Any:
    """The step the user asked to open (None without DATASET): transforms default to the modality's."""
    from shardstream.viz.catalog import Catalog, default_transforms
    from shardstream.viz.query import StepQuery

    if not args.dataset:
        return None
    transforms = args.transforms
    if transforms is None:
        transforms = "" if ":" in args.dataset else default_transforms(Catalog(source).version(args.dataset))
    label = source.target(StepQuery(args.dataset, columns=args.columns or "")).label
    return StepQuery(label, transforms=transforms, **_plan(args))


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "seed": args.seed,
        "shuffle": args.shuffle,
        "window": args.window or 0,
        "world_size": args.world_size,
        "batch_size": args.batch_size,
        "rank": args.rank,
        "step": args.step,
        "epoch": args.epoch,
        "columns": args.columns or "",
        "on_error": args.on_error,
        "drop_last": args.drop_last,
    }


def _exit_on_sigterm() -> None:
    """SIGTERM ends the command through SystemExit, so the server it started is stopped on the way out.

    uvicorn handles SIGTERM itself and then raises it again once it has shut down; with the default
    action the process would die there, before the `with` block that stops the embedded server."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)


def _cmd_view(args: argparse.Namespace) -> int:
    if not _need("textual", "view"):
        return common.EXIT_ERROR
    from shardstream.viz.tui.tui_app import ViewApp

    _exit_on_sigterm()
    with _source(args) as source:
        _reachable(source)
        start = _start(args, source)
        defaults = {k: v for k, v in _plan(args).items() if k in ("seed", "shuffle", "window", "world_size", "batch_size")}
        app = ViewApp(source, start, defaults)
        app.run()
    return 0 if not app.return_code else common.EXIT_ERROR


def _cmd_web(args: argparse.Namespace) -> int:
    if not _need("starlette", "web") or not _need("uvicorn", "web"):
        return common.EXIT_ERROR
    import uvicorn

    from shardstream.viz.web.links import step_url
    from shardstream.viz.web.web_app import create_app

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"shardstream: warning: serving the web UI on {args.host} without TLS or authentication", file=sys.stderr)
    _exit_on_sigterm()
    with _source(args) as source:
        _reachable(source)
        start = _start(args, source)
        base = f"http://{'localhost' if args.host in ('127.0.0.1', '::1') else args.host}:{args.port}"
        print(f"shardstream web: {base}/{step_url(start)[1:] if start else ''}", flush=True)
        uvicorn.run(create_app(source, store=args.store), host=args.host, port=args.port, log_level="warning")
    return 0


def _common_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("dataset", nargs="?", help="open this NAME[@VERSION] (or mixture 'a@1:0.7,b@2:0.3') at --step")
    sp.add_argument("--server", help="read through a running fleet: HOST:PORT[,HOST:PORT...] (default: start one over --root)")
    common.root_options(sp)
    common.store_option(sp)
    sp.add_argument("--metrics", action="append", metavar="URL", help="a server's /metrics URL for the fleet page (repeat per server)")
    sp.add_argument("--seed", type=int, default=0, help="the job's seed (default 0)")
    sp.add_argument("--shuffle", default="block", choices=("none", "block", "full"), help="shuffle mode (default block)")
    sp.add_argument("--window", type=common.positive_int, help="blocks per window for --shuffle block (default 16)")
    sp.add_argument("--world-size", type=common.positive_int, default=1, help="ranks in the job (default 1)")
    sp.add_argument("--batch-size", type=common.positive_int, default=8, help="per-rank batch size (default 8)")
    sp.add_argument("--rank", type=int, default=0, help="rank to open (default 0)")
    sp.add_argument("--step", type=int, default=0, help="step to open (default 0)")
    sp.add_argument("--epoch", type=int, default=0, help="epoch (default 0)")
    sp.add_argument("--columns", help="comma-separated columns the job reads (default: all)")
    sp.add_argument(
        "--transforms",
        help="the job's transforms as JSON, as Loader(transforms=...) (default: the modality's usual decode; '' = as stored)",
    )
    sp.add_argument("--on-error", default="fail", choices=("fail", "skip"), help="what transforms do with a bad sample")
    sp.add_argument("--drop-last", action="store_true", help="the job drops the epoch's incomplete last step")
    common.client_security_options(sp)


def add_commands(sub: Any) -> None:
    view = common.add_command(
        sub,
        "view",
        _cmd_view,
        help="terminal UI: browse datasets, versions and each rank's batches as received",
        description="Browse datasets -> versions (history, diff, schema, modality) -> steps, in the terminal: each "
        "rank's batch exactly as the trainer receives it (after shuffling, mixing and server-side transforms), with "
        "the provenance of every sample. Keys in the step browser: left/right step, up/down rank, e epoch, t edit "
        "transforms, / jump to a step or @position, esc back, q quit (on every screen). Needs the view extra (textual).",
        epilog=common.examples(
            "shardstream view --root ./datasets",
            "shardstream view photos@1 --root ./datasets --world-size 4 --rank 3 --step 12",
            "shardstream view web@3 --server 10.0.0.5:7070 --batch-size 32 --seed 7",
            "shardstream view web@3 --server 10.0.0.5:7070 --tls-ca ca.crt --token-file token.txt",
            "shardstream view text@1 --root ./datasets --transforms '[{\"op\": \"text.tokenize\", \"column\": \"text\"}]'",
        ),
    )
    _common_options(view)
    web = common.add_command(
        sub,
        "web",
        _cmd_web,
        help="web UI: the same, in a browser, with the state in every URL",
        description="Serve the browser visualizer: datasets, versions, diffs, each rank's batch at any step (image "
        "grids with the stored originals, audio players and waveforms, video frame strips, tokens with packing "
        "boundaries, RL reward/return plots), mixture shares, the shuffle-quality plot, jobs from the cursor store "
        "and the fleet's health. Every page is a link with its state in the URL. Binds 127.0.0.1 unless --host says "
        "otherwise. Needs the web extra (starlette, uvicorn, jinja2).",
        epilog=common.examples(
            "shardstream web --root ./datasets --port 8080",
            "shardstream web photos@1 --root ./datasets --world-size 4 --rank 3 --step 12",
            "shardstream web --server 10.0.0.5:7070,10.0.0.6:7070 --metrics http://10.0.0.5:9090/metrics --port 8080",
            "shardstream web --root ./datasets --store sqlite:///.shardstream/cursors.db",
        ),
    )
    _common_options(web)
    web.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    web.add_argument("--port", type=common.port, default=8080, help="port (default 8080)")

