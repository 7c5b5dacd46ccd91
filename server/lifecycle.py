"""Server lifecycle in one place: build, start, wait for SIGTERM/SIGINT, drain, stop.

Drain: health goes NOT_SERVING (load balancers and probes stop sending new streams), the server
stops accepting RPCs, in-flight streams get `grace_s` seconds to finish, then the process exits 0.
The metrics port (server/serving/status_http.py) serves /metrics, and /healthz and /readyz for HTTP probes: ready
from the moment health says SERVING until the drain begins.

With `workers > 1` (or `--workers auto`: autoscale_max_workers > 1), `run` becomes a supervisor
(server/serving/supervisor.py) of that many processes, each running
`serve` on the same port (SO_REUSEPORT among themselves only); `workers == 1` is one process, as here.

Each process serves the control plane (GetDataset, ListDatasets, grpc.health) on `port` and the
data plane — Read streams as Arrow Flight DoGet (server/serving/data_plane_server.py, server/serving/data_plane.py) — on `data_port`
(a supervisor's worker i on data_port + i); GetDataset tells clients the data port. A drain stops
both: no new streams, and in-flight ones get the grace.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import grpc
import pyarrow as pa
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import REGISTRY

from shardstream import allocator
from shardstream.errors import InvalidArgumentError
from shardstream.registry import Registry

from .backends.roots import open_registry
from .checkpoints import open_checkpoint_plane
from .policy.auth import Authenticator
from .read.message_buffers import DEFAULT_MAX_BYTES as MESSAGE_BUFFERS_MAX_BYTES
from .read.message_buffers import message_buffers
from .read.reader import new_row_group_cache
from .read.spill import SpillTier
from .serving import security
from .serving.admission import Admission
from .serving.config import ServerConfig
from .serving.control_plane import SERVICE_NAME, ShardStreamService
from .serving.cpus import cpu_of_slot, pin
from .serving.data_plane_server import DataPlane
from .serving.log_format import configure_logging
from .serving.placement import Placement
from .serving.process_metrics import disable_created_series, register_build_info
from .serving.ready import write_ready_file
from .serving.rpc_metrics import RpcMetrics
from .serving.status_http import Health, start_status_server
from .serving.stream_runtime import StreamRuntime

__all__ = ["SERVER_OPTIONS", "WORKER_OPTIONS", "run", "serve", "server_options"]

log = logging.getLogger("shardstream.server")

# Server channel options, one comment each (units in the names); server_options() adds those the
# config sets (keepalive, idle connections).
SERVER_OPTIONS = [
    # One server per port: fail loudly when the port is taken instead of silently sharing it.
    ("grpc.so_reuseport", 0),
    # Accept client keepalive pings every 5 s (the client pings every 10 s when idle).
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Requests are small; batches go the other way and are bounded by --max-message-mib.
    ("grpc.max_receive_message_length", 4 << 20),
]
# The workers of one supervisor share its port; the supervisor checked it was free and holds it
# (server/serving/supervisor.py), so another server still fails loudly on it.
WORKER_OPTIONS = [("grpc.so_reuseport", 1), *(o for o in SERVER_OPTIONS if o[0] != "grpc.so_reuseport")]


def server_options(cfg: ServerConfig) -> list[tuple[str, int]]:
    """The channel options of a server with this config."""
    keepalive_timeout_ms = round(cfg.keepalive_timeout_s * 1000)
    return [
        *(WORKER_OPTIONS if cfg.reuse_port else SERVER_OPTIONS),
        # Ping each client every keepalive_time (also while its streams are blocked on a full window)
        # and close the connection when a ping goes unanswered for keepalive_timeout: a frozen or
        # vanished client's streams end and release their memory. ping_timeout applies the same
        # limit to gRPC's other pings, which would otherwise hold the keepalive back for 60 s.
        ("grpc.keepalive_time_ms", round(cfg.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", keepalive_timeout_ms),
        ("grpc.http2.ping_timeout_ms", keepalive_timeout_ms),
        ("grpc.http2.max_pings_without_data", 0),
        # A connection without calls this long is closed with a GOAWAY (its client reconnects).
        ("grpc.max_connection_idle_ms", round(cfg.max_connection_idle_s * 1000)),
    ]


async def serve(cfg: ServerConfig) -> None:
    registry = open_registry(cfg.root, s3_endpoint=cfg.s3_endpoint)
    try:
        # Fail fast with one clear line: a missing directory, an unreachable S3, refused credentials.
        await asyncio.to_thread(registry.storage.check_root)
        await _serve(cfg, registry)
    finally:
        registry.close()


async def _serve(cfg: ServerConfig, registry: Registry) -> None:
    spill = SpillTier(cfg.cache_dir, cfg.cache_dir_bytes) if cfg.cache_dir else None
    cache = new_row_group_cache(cfg.cache_bytes, spill)
    limits = cfg.admission_limits()
    # gathered messages' buffers kept for reuse: within the bound's slack (admission.py)
    message_buffers().max_bytes = min(MESSAGE_BUFFERS_MAX_BYTES, limits.buffer_bytes // 8)
    runtime = StreamRuntime(
        registry,
        cache,
        read_ahead=cfg.read_ahead,
        transform_threads=cfg.transform_threads,
        limits=cfg.request_limits(),
        admission=Admission(limits),
        write_timeout_s=cfg.write_timeout_s,
        auth=Authenticator(cfg.auth_file),
    )
    if cfg.checkpoint_root:  # before the data plane starts: it serves them (serving/data_plane.py)
        runtime.checkpoints = open_checkpoint_plane(
            cfg.checkpoint_root,
            cache,
            runtime.auth,
            lambda: runtime.grants,
            s3_endpoint=cfg.s3_endpoint,
            limits=cfg.checkpoint_limits,
        )
    service = ShardStreamService(runtime)  # the control plane; Read streams are the data plane's
    server = grpc.aio.server(options=server_options(cfg), interceptors=[RpcMetrics()])
    server.add_generic_rpc_handlers((service.handler(),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if cfg.reflection:  # off unless asked for: it lists the services to anyone who connects
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
    address = f"{cfg.host}:{cfg.port}"
    if cfg.port and not cfg.reuse_port:  # one clear line, before grpc logs its own about the bind
        from .serving.ports import reserve_port

        reserve_port(cfg.host, cfg.port, hold=False)
    creds = security.credentials(cfg)
    try:
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError as exc:
        raise InvalidArgumentError(f"cannot listen on {address}: {exc} (is the port in use?)") from exc
    if port == 0:
        raise InvalidArgumentError(f"cannot listen on {address} (is the port in use?)")
    service.port = port
    data_plane = DataPlane.start(cfg, runtime)
    if cfg.placement_file:  # a supervisor's worker: streams go to the least busy worker (placement.py)
        runtime.placement = Placement(cfg.placement_file, cfg.worker_slot, runtime.data_port)
    metrics_port = None
    status = Health()  # what /healthz and /readyz answer
    if cfg.metrics_port is not None:
        register_build_info(REGISTRY)
        metrics_port = start_status_server(cfg.metrics_port, cfg.host, REGISTRY, status).server_port

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    status.started = True
    log.info(
        "serving %s on %s:%d, Read streams on %d (%s; metrics on %s)",
        registry.root,
        cfg.host,
        port,
        data_plane.port,
        security.describe(cfg),
        metrics_port or "-",
    )
    if cfg.ready_file:
        pid = os.getpid()
        write_ready_file(
            cfg.ready_file,
            {
                "port": port,
                "data_port": data_plane.port,
                "metrics_port": metrics_port,
                "pid": pid,
                "workers": [pid],
            },
        )
    try:
        await stop.wait()
        status.draining = True
        log.info("draining: health NOT_SERVING, %.1f s grace for in-flight streams", cfg.grace_s)
        await health_servicer.enter_graceful_shutdown()
    finally:
        # both at once: the control plane's calls and the data plane's streams get the grace
        flight_stop = asyncio.ensure_future(asyncio.to_thread(data_plane.stop, cfg.grace_s))
        await server.stop(cfg.grace_s)
        if not await flight_stop:
            log.warning("Read streams still in progress after the %.1f s grace: leaving them", cfg.grace_s)
    log.info("stopped")


def _arrow_memory_pool() -> str:
    """Arrow's allocations (gathered rows, transform outputs, decoded row groups) from jemalloc with
    immediate decay: what a build or an evicted row group frees goes back to the system at once.
    pyarrow's default pool (mimalloc) keeps pages that one thread allocated and another freed until
    the first allocates again, which stalled streams never make it do: 256 stalled block-shuffled
    streams held 2.0 GiB of RSS against a 256 MiB buffer budget with it, 0.8 GiB with jemalloc
    (loadtest.stall_bench, loadtest/README.md). Its pages are huge where the entry point set
    $JE_ARROW_MALLOC_CONF before pyarrow loaded (shardstream/allocator.py, arrow_huge_pages).
    $ARROW_DEFAULT_MEMORY_POOL, when set, wins. The pool's name.

    `jemalloc_set_decay_ms` sets the decay of the arenas jemalloc creates after the call, not of
    arena 0, made as pyarrow loads: that one keeps Arrow's 1 s (threads are bound to arenas as they
    first allocate, `narenas` of them; on 2 CPUs one of two arenas decays in 1 s). Measured both
    ways (loadtest/README.md, "Decay in every arena"): 0 or 1 s in every arena leaves the stalled
    streams' peak RSS where it is."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return pa.default_memory_pool().backend_name
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
        pa.jemalloc_set_decay_ms(0)
    except NotImplementedError:  # a pyarrow built without jemalloc
        pass
    return pa.default_memory_pool().backend_name


def run(cfg: ServerConfig) -> None:
    """Run the server until SIGTERM/SIGINT, on uvloop where available (a supervisor if workers > 1)."""
    configure_logging(cfg.log_format)  # $SHARDSTREAM_LOG_LEVEL, --log-format (server/serving/log_format.py)
    disable_created_series()  # no *_created series (server/serving/process_metrics.py)
    if not cfg.reuse_port:  # once per server (a supervisor's workers were checked by it)
        security.check(cfg)
    if cfg.worker_slots > 1:
        from .serving.supervisor import supervise

        supervise(cfg)
        return
    if cfg.pin_workers:  # before any thread starts: they inherit it (serving/cpus.py)
        pin(cfg.worker_cpu if cfg.worker_cpu >= 0 else cpu_of_slot(0))
    allocator.tune()  # fewer fresh-page faults per message (see shardstream/allocator.py)
    _arrow_memory_pool()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is in the server extra
        asyncio.run(serve(cfg))
    else:
        uvloop.run(serve(cfg))
