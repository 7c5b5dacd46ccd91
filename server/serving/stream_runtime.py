"""The stream runtime (DESIGN §6): what every Read stream of a server process shares, whichever plane
carries it.

`StreamRuntime` holds the planner (server/read/plan.py), the message builder (server/read/build.py),
admission (admission.py: streams per server and per peer, bytes held), read-ahead, authentication and
the grants that vouch for certificate callers (policy/auth.py, policy/grants.py), the stream metrics, the stream log
and the one mapping of errors to statuses (`status_of`): every ShardstreamError leaves as its own gRPC
status code (errors.py; a request that does not even parse is INVALID_ARGUMENT); anything else is
logged and leaves as INTERNAL. What a client reads of an error names dataset versions and shards, never
a server path or an exception's text (policy/redact.py); the server's log keeps the rest. Stream metrics carry
the dataset's name as a bounded `dataset` label (policy/dataset_label.py).

The planes only adapt it to their transport: the Flight data plane (data_plane.py) serves Read streams
from it, the control plane (control_plane.py) resolves datasets with its planner and issues its grants.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grpc
from prometheus_client import Counter, Gauge

from shardstream.errors import ResourceExhaustedError, ShardstreamError
from shardstream.registry import Registry
from shardstream.v1 import shardstream_pb2 as pb

from ..policy.auth import Authenticator, Principal
from ..policy.dataset_label import dataset_label, dataset_name, names_label
from ..policy.grants import Grants, caller_principal
from ..policy.redact import client_error
from ..read.build import MessageBuilder
from ..read.plan import ReadPlan, ReadPlanner
from ..read.readahead import DEFAULT_READ_AHEAD_MESSAGES, ReadAhead
from ..read.reader import RowGroupCache
from ..read.request_limits import RequestLimits
from .admission import Admission
from .config import DEFAULT_WRITE_TIMEOUT_S
from .placement import Placement
from .rpc_metrics import code_name
from .stream_log import StreamLog, new_stream_id

__all__ = [
    "BATCHES_SENT",
    "BYTES_SENT",
    "MESSAGES_SENT",
    "ROWS_SENT",
    "STREAMS",
    "STREAMS_ACTIVE",
    "STREAM_ERRORS",
    "StreamRuntime",
]

log = logging.getLogger(__name__)

STREAMS_ACTIVE = Gauge(
    "shardstream_streams_active", "Read streams in progress", ["dataset"], multiprocess_mode="livesum"
)
STREAMS = Counter("shardstream_streams_total", "Read streams started (planned)", ["dataset"])
STREAM_ERRORS = Counter(
    "shardstream_stream_errors_total", "Read streams that ended with an error status", ["dataset", "code"]
)
BATCHES_SENT = Counter("shardstream_batches_sent_total", "Steps (per-rank batches) sent", ["dataset"])
MESSAGES_SENT = Counter("shardstream_messages_sent_total", "Read messages sent", ["dataset"])
ROWS_SENT = Counter("shardstream_rows_sent_total", "Rows sent", ["dataset"])
BYTES_SENT = Counter("shardstream_bytes_sent_total", "Bytes of Read messages sent", ["dataset"])
_LOGGED_MAX = 1000  # distinct bad entries / data-loss messages logged per process before going quiet


class StreamRuntime:
    """One per server process, shared by all its streams (the planner's readers and orders too)."""

    def __init__(
        self,
        registry: Registry,
        cache: RowGroupCache,
        *,
        read_ahead: int = DEFAULT_READ_AHEAD_MESSAGES,
        transform_threads: int = 1,
        limits: RequestLimits | None = None,
        admission: Admission | None = None,
        write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
        auth: Authenticator | None = None,
    ) -> None:
        self.registry = registry
        self.auth = auth or Authenticator(None)
        self.planner = ReadPlanner(registry, cache, limits)
        self.builder = MessageBuilder(transform_threads=transform_threads)
        self.admission = admission or Admission()
        self.write_timeout_s = write_timeout_s  # a stream Flight writes no further for this long is reaped
        self.data_port = 0  # the Flight data plane's port (data_plane_server.py), once bound: GetDataset names it
        self.grants: Grants | None = None  # with a data plane: what vouches for certificate callers
        self.checkpoints: Any = None  # `serve --checkpoint-root`: the checkpoint plane (server/checkpoints/)
        self.placement: Placement | None = None  # a supervisor's worker: where streams go (placement.py)
        self.read_ahead = ReadAhead(read_ahead, cache)  # each stream's next row groups, fetched ahead
        self._logged: set[str] = set()  # what was logged once already (bad entries, data-loss messages)

    def log_once(self, what: str) -> bool:
        """True the first time `what` is seen (and while fewer than _LOGGED_MAX were)."""
        if what in self._logged or len(self._logged) >= _LOGGED_MAX:
            return False
        self._logged.add(what)
        return True

    def status_of(
        self, method: str, exc: BaseException, stream: StreamLog | None = None
    ) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
        """The status a failed call ends with (code, what the client may read, trailing metadata);
        logged as needed, and counted against its stream."""
        sid = f" (stream {stream.stream_id})" if stream is not None else ""
        if isinstance(exc, ShardstreamError) and exc.grpc_code == grpc.StatusCode.DATA_LOSS and self.log_once(str(exc)):
            log.warning("%s%s: %s", method, sid, exc, exc_info=exc)  # the cause chain: files and errors
        exc, details = client_error(exc, self.registry.storage, log, f"{method}{sid}")
        if stream is not None:
            stream.failed(code_name(exc.grpc_code), details)
            STREAM_ERRORS.labels(stream.label, stream.outcome).inc()
        metadata = exc.trailing_metadata() if isinstance(exc, ResourceExhaustedError) else ()
        return exc.grpc_code, details, metadata

    def data_principal(self, headers: Mapping[str, list[Any]], metadata: list[tuple[str, str]], ticket: bytes) -> Principal:
        """A data-plane caller: its token's principal when it sent a token (a grant beside it is not
        looked at: a grant never widens what a token may read), else the principal of the grant the
        gRPC port gave its certificate, with the proof that it holds that certificate's key (policy/grants.py)."""
        return caller_principal(self.auth, self.grants, headers, metadata, lambda: ticket)

    # --- a stream's log and metrics ---------------------------------------------------------------
    def stream_log(
        self, request: pb.ReadRequest | None, peer: str, stream_id: str | None = None
    ) -> StreamLog:
        """A new stream's log lines (stream_log.py), labelled by the dataset it asks for."""
        stream = StreamLog(stream_id or new_stream_id(), peer)
        stream.asked(request)
        if request is not None:  # labelled by name only once admitted (policy/dataset_label.py)
            name = dataset_name(request.dataset, [s.dataset for s in request.mixture])
            stream.label = dataset_label(name, admit=False)
        return stream

    def stream_started(self, stream: StreamLog, plan: ReadPlan, active: Any) -> Any:
        """A planned stream: its dataset label admitted, counted, logged; its active gauge's child."""
        # the manifests' names (the request's refs were parsed by the label before planning and by the plan)
        label = dataset_label(names_label([r.manifest.name for r in plan.readers]), admit=True)
        if plan.pipeline:
            plan.pipeline.dataset = label
        STREAMS.labels(label).inc()
        if label != stream.label:
            active.dec()
            active = STREAMS_ACTIVE.labels(label)
            active.inc()
        stream.start(", ".join(r.manifest.ref for r in plan.readers), label)
        return active


