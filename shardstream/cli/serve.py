"""`shardstream serve`: run a shard-reader server (needs the server extra)."""

from __future__ import annotations

import argparse
from typing import Any

from shardstream.errors import InvalidArgumentError

from . import common

__all__ = ["add_commands", "config_from_args"]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value


def _workers(text: str) -> int | str:
    """--workers: a count, or "auto" (grow and shrink on the trainers' stall)."""
    return "auto" if text == "auto" else common.positive_int(text)


def config_from_args(args: argparse.Namespace) -> Any:
    """The ServerConfig the parsed `serve` arguments ask for."""
    from shardstream.server.checkpoints.limits import CheckpointLimits
    from shardstream.server.serving.config import ServerConfig
    from shardstream.server.serving.cpus import usable_cpus

    auto = args.workers == "auto"
    if not auto and (args.max_workers is not None or args.autoscale_interval is not None):
        raise InvalidArgumentError("--max-workers and --autoscale-interval go with --workers auto")
    return ServerConfig(
        root=args.root,
        port=args.port,
        host=args.host,
        metrics_port=args.metrics_port,
        cache_bytes=args.cache_mib << 20,
        grace_s=args.grace,
        ready_file=args.ready_file,
        s3_endpoint=args.s3_endpoint,
        workers=1 if auto else args.workers or usable_cpus(),
        autoscale_max_workers=(args.max_workers or usable_cpus()) if auto else 0,
        autoscale_interval_s=args.autoscale_interval or 5.0,
        pin_workers=args.pin_workers,
        # remote roots have latency to hide; local reads are CPU-bound (loadtest/README.md)
        read_ahead=args.read_ahead if args.read_ahead is not None else int(args.root.startswith("s3://")),
        cache_dir=args.cache_dir,
        cache_dir_bytes=args.cache_dir_mib << 20,
        transform_threads=args.transform_threads or usable_cpus(),
        max_batch_size=args.max_batch_size,
        max_message_bytes=args.max_message_mib << 20,
        max_sample_bytes=args.max_sample_mib << 20,
        max_streams=args.max_streams,
        max_streams_per_peer=args.max_streams_per_peer,
        stream_buffer_bytes=args.stream_buffer_mib << 20,
        write_timeout_s=args.write_timeout,
        keepalive_time_s=args.keepalive_time,
        keepalive_timeout_s=args.keepalive_timeout,
        max_connection_idle_s=args.max_connection_idle,
        log_format=args.log_format,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        auth_file=args.auth,
        reflection=args.reflection,
        data_port=args.data_port if args.data_port is not None else (args.port + 1 if args.port else 0),
        advertised_data_port=args.advertised_data_port,
        checkpoint_root=args.checkpoint_root,
        checkpoint_limits=CheckpointLimits(
            max_record_bytes=args.checkpoint_max_record_mib << 20,
            max_chunk_bytes=args.checkpoint_max_chunk_mib << 20,
            inflight_job_bytes=args.checkpoint_inflight_mib << 20,
            inflight_principal_bytes=2 * (args.checkpoint_inflight_mib << 20),
            job_quota_bytes=round(args.checkpoint_job_quota_gib * (1 << 30)) if args.checkpoint_job_quota_gib else None,
        ),
    )


def _cmd_serve(args: argparse.Namespace) -> int:
    from shardstream.server.lifecycle import run

    run(config_from_args(args))
    return 0


def add_commands(sub: Any) -> None:
    sp = common.add_command(
        sub,
        "serve",
        _cmd_serve,
        help="run a shard-reader server",
        description="Serve the datasets under --root: the control plane over gRPC on --port (ShardStream, "
        "grpc.health.v1, and reflection with --reflection) and Read streams over Arrow Flight on --data-port, "
        "until SIGTERM/SIGINT, then drain: health goes NOT_SERVING and in-flight "
        "streams get --grace seconds to finish. With --workers N > 1, N worker processes share the "
        "port (SO_REUSEPORT among themselves; the port must be free) under a supervisor that restarts "
        "a worker that dies, drains them all on SIGTERM and serves their summed /metrics. With --workers auto "
        "it starts one and adds one while the trainers' data stall (their Loaders' reports) stays above 5%, "
        "up to --max-workers (default: the usable CPUs), and drains one only while the rest would still "
        "carry their consumption (deploy/RUNBOOK.md, \"Sizing\").",
        epilog=common.examples(
            "shardstream serve --root ./datasets",
            "shardstream serve --root ./datasets --port 7070 --metrics-port 9090 --workers 4",
            "shardstream serve --root ./datasets --metrics-port 9090 --workers auto --max-workers 8",
            "shardstream serve --root s3://bucket/registry --cache-dir /var/cache/shardstream --host 0.0.0.0",
            "shardstream --root ./datasets serve --port 0 --ready-file ready.json",
            "shardstream serve --root ./datasets --max-streams 256 --stream-buffer-mib 512 --write-timeout 120",
            "shardstream serve --root ./datasets --host 0.0.0.0 --tls-cert tls.crt --tls-key tls.key --auth auth.yaml",
            "shardstream serve --root ./datasets --host 0.0.0.0 --tls-cert tls.crt --tls-key tls.key "
            "--tls-client-ca ca.crt",
            "shardstream serve --root ./datasets --port 7070 --data-port 7071",
        ),
    )
    common.root_options(sp)
    sp.add_argument(
        "--port", type=common.port, default=7070, help="gRPC port (default 7070; 0 picks a free one)"
    )
    sp.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; 0.0.0.0 for all: a warning says so when neither TLS nor "
        "--auth protects it)",
    )
    sp.add_argument(
        "--metrics-port",
        type=common.port,
        help="serve Prometheus /metrics, and /healthz and /readyz for HTTP probes, on this port (0 picks one)",
    )
    sp.add_argument(
        "--workers",
        type=_workers,
        metavar="{N,auto}",
        help="server processes sharing the port (default: the usable CPUs, affinity and cgroup "
        "quota; 1 = a single process); auto: from 1 up to --max-workers, on the trainers' stall "
        "(shardstream_autoscale_decisions_total{reason} counts each move, one log line says why)",
    )
    sp.add_argument(
        "--pin-workers",
        action="store_true",
        help="pin worker i to the i-th usable CPU (a single process: to the first), so that a worker is "
        "one core's worth, as --workers auto sizes them; without it a worker's build and transform "
        "threads use every core",
    )
    sp.add_argument(
        "--max-workers",
        type=common.positive_int,
        help="with --workers auto: the most worker processes (default: the usable CPUs); data ports "
        "--data-port .. + max - 1 must be free",
    )
    sp.add_argument(
        "--autoscale-interval",
        type=_seconds,
        help="with --workers auto: seconds between two decisions (default 5; a move needs 3 in a row "
        "stalled, 24 with a worker to spare, and is followed by 6 without one)",
    )
    sp.add_argument(
        "--cache-mib",
        type=common.positive_int,
        default=1024,
        help="row-group cache size of the server, split evenly between its workers (default 1024)",
    )
    sp.add_argument(
        "--cache-dir",
        help="local-disk tier under the memory cache, shared by the workers (and later runs): row groups "
        "read from storage are kept here as Arrow files named by shard content hash (default: none)",
    )
    sp.add_argument(
        "--cache-dir-mib",
        type=common.positive_int,
        default=8192,
        help="size bound of --cache-dir (default 8192)",
    )
    sp.add_argument(
        "--read-ahead",
        type=int,
        choices=range(0, 9),
        metavar="{0..8}",
        help="messages of each stream whose row groups are fetched before they are built (0 = off; "
        "default 1 for s3:// roots, 0 for local ones, where reads cost CPU and hide no latency)",
    )
    sp.add_argument(
        "--grace", type=float, default=10.0, help="seconds in-flight streams get on shutdown (default 10)"
    )
    sp.add_argument(
        "--ready-file",
        help="write {port, data_port, metrics_port, pid, workers} as JSON here once every worker serves",
    )
    sp.add_argument(
        "--data-port",
        type=common.port,
        help="the Arrow Flight data plane's port, where Read streams flow (default: --port + 1; with --port 0, "
        "a free one); with --workers N, worker i serves data-port + i. Clients learn it from GetDataset",
    )
    sp.add_argument(
        "--advertised-data-port",
        type=common.port,
        default=0,
        help="the data port GetDataset names, when clients reach --data-port by another (a NAT, a port "
        "mapping, a proxy; worker i: this + i; default: --data-port)",
    )
    sp.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines as text (default) or one JSON object per line; each Read stream logs a "
        "stream.start and a stream.end line with its stream id",
    )
    sec = sp.add_argument_group(
        "security", "TLS, client certificates and who may read what (docs/security.md; RUNBOOK: TLS and tokens)"
    )
    sec.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this PEM certificate chain (re-read when it changes)")
    sec.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert (re-read when it changes)")
    sec.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="mTLS: require a client certificate signed by a CA of this PEM file (re-read when it changes)",
    )
    sec.add_argument(
        "--auth",
        metavar="FILE",
        help="YAML principals: each a token_sha256 and/or mtls_subject and the dataset patterns it may read; "
        "calls without known credentials are UNAUTHENTICATED (re-read when it changes; default: no auth)",
    )
    sec.add_argument(
        "--reflection",
        action="store_true",
        help="enable gRPC server reflection (off by default: it lists the services to anyone who connects)",
    )
    limits = sp.add_argument_group(
        "limits", "admission control: what one request or client may take of a server (RUNBOOK: Limits)"
    )
    limits.add_argument(
        "--max-batch-size",
        type=common.positive_int,
        default=65_536,
        help="largest batch_size (rows per rank per step) a Read may ask for (default 65536)",
    )
    limits.add_argument(
        "--max-message-mib",
        type=common.positive_int,
        default=64,
        help="cap on one Read message; a client's larger max_message_bytes is clamped to it and a larger "
        "step is sent in parts (default 64)",
    )
    limits.add_argument(
        "--max-sample-mib",
        type=common.positive_int,
        default=64,
        help="cap on a transform's output per sample (image pixels, video frames, audio samples, "
        "text.pack seq_len, rl.windows window); larger asks are INVALID_ARGUMENT (default 64)",
    )
    limits.add_argument(
        "--max-streams",
        type=common.positive_int,
        default=1024,
        help="Read streams the server runs at once, split between its workers; more are refused with "
        "RESOURCE_EXHAUSTED and a retry hint (default 1024)",
    )
    limits.add_argument(
        "--max-streams-per-peer",
        type=common.positive_int,
        default=256,
        help="Read streams one client address (all its connections) may run at once on each worker "
        "(default 256)",
    )
    limits.add_argument(
        "--stream-buffer-mib",
        type=common.positive_int,
        default=1024,
        help="bytes of built messages the streams may hold before they stop building ahead and new "
        "streams are refused, split between the workers (default 1024)",
    )
    limits.add_argument(
        "--write-timeout",
        type=_seconds,
        default=300.0,
        metavar="SECONDS",
        help="a stream whose client reads nothing this long is cut (its connection closed; the client "
        "resumes at its first missing step) (default 300)",
    )
    limits.add_argument(
        "--keepalive-time",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="ping each client of the control port this often (default 30; the data plane's Flight server "
        "sends no pings: --write-timeout cuts its frozen clients)",
    )
    limits.add_argument(
        "--keepalive-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="close a control-port connection whose client answers no ping for this long (default 10)",
    )
    limits.add_argument(
        "--max-connection-idle",
        type=_seconds,
        default=600.0,
        metavar="SECONDS",
        help="close a control-port connection without calls for this long (default 600)",
    )
    sp.add_argument(
        "--checkpoint-root",
        metavar="URL",
        default=None,
        help="keep training checkpoints under this directory or s3://bucket/prefix and move them over the "
        "data plane (Checkpointer; `shardstream checkpoint`); --auth principals need `checkpoints:` job globs",
    )
    ck = sp.add_argument_group("checkpoint limits (what one writer may ask of this server)")
    ck.add_argument(
        "--checkpoint-max-chunk-mib",
        type=common.positive_int,
        default=64,
        metavar="MIB",
        help="largest checkpoint chunk a DoPut may send (default 64; the Checkpointer sends 8 MiB chunks)",
    )
    ck.add_argument(
        "--checkpoint-max-record-mib",
        type=common.positive_int,
        default=64,
        metavar="MIB",
        help="largest checkpoint call body (a rank's part record, a chunk list), refused before it is parsed "
        "(default 64: ~300k tensors a rank)",
    )
    ck.add_argument(
        "--checkpoint-inflight-mib",
        type=common.positive_int,
        default=512,
        metavar="MIB",
        help="chunk bytes this server holds at once for one job (twice this for one principal); more waits "
        "for room, then is RESOURCE_EXHAUSTED (default 512)",
    )
    ck.add_argument(
        "--checkpoint-job-quota-gib",
        type=float,
        default=None,
        metavar="GIB",
        help="bytes a job may keep under --checkpoint-root (as each server counts them); over it a save is "
        "RESOURCE_EXHAUSTED (default: no quota)",
    )
    sp.add_argument(
        "--transform-threads",
        type=common.positive_int,
        default=None,
        help="threads per worker for server-side transforms (image/audio/video decode, tokenizing; they "
        "run without the GIL): default = the usable CPUs",
    )
