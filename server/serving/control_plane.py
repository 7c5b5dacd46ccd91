"""The ShardStream servicer: the control plane on grpc.aio (GetDataset, ListDatasets).

GetDataset and ListDatasets are proto in -> registry -> proto out, over the process's stream runtime
(stream_runtime.py: its planner resolves datasets, its grants vouch for certificate callers, its
`status_of` maps errors to statuses). GetDataset's answer names the
port of this process's data plane (data_plane.py: Read streams as Arrow Flight DoGet), and to a
caller it authenticated by its client certificate it gives a grant bound to that certificate
(policy/grants.py). Every ShardstreamError leaves as its own gRPC status code (a request that does not even
parse is INVALID_ARGUMENT); anything else is logged and leaves as INTERNAL, its text redacted.

ListDatasets lists every dataset it can read and skips the bad entries (server/transforms/ops.py): each is logged
once per process, with its detail, and `shardstream_registry_bad_entries` counts them. Asked with
`data_plane_only` (a Checkpointer finding the data plane) it lists none and reads no manifest: the
data port and a certificate caller's grant only.

Every call is authenticated first (policy/auth.py: a bearer token or a client certificate's subject, when
the server has `--auth`) and every dataset it names is checked against the caller's patterns;
ListDatasets lists only the latest versions the caller may read. Each call refused as
UNAUTHENTICATED or PERMISSION_DENIED leaves one line in the audit log (audit.py), as each Read
stream does. RPC counts and times are the grpc-ecosystem metrics, kept by an interceptor for every
service of this port (rpc_metrics.py) and by the data plane for its DoGet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from prometheus_client import Gauge

from shardstream import __version__
from shardstream.errors import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError
from shardstream.extension_types import plain_schema
from shardstream.manifest import Manifest
from shardstream.registry import BadEntry
from shardstream.v1 import shardstream_pb2 as pb

from ..policy.auth import OPEN, Principal, has_token
from ..policy.grants import GRANT_TTL_S, peer_fingerprint
from .audit import audit_call
from .rpc_metrics import preinitialize
from .stream_runtime import StreamRuntime

__all__ = ["SERVICE_NAME", "ShardStreamService", "dataset_info"]

# Every control-plane answer names the server's version in its initial metadata (`shardstream ping`).
VERSION_METADATA = (("x-shardstream-version", __version__),)

log = logging.getLogger(__name__)

SERVICE_NAME = "shardstream.v1.ShardStream"
METHODS = ("GetDataset", "ListDatasets")

REGISTRY_BAD_ENTRIES = Gauge(
    "shardstream_registry_bad_entries",
    "Registry entries (manifests, dataset directories) ListDatasets found unreadable and skipped, at its last call",
    multiprocess_mode="livemax",
)
preinitialize(SERVICE_NAME, {"GetDataset": "unary", "ListDatasets": "unary"})  # 0 for the known series

T = TypeVar("T")


def _lenient(parse: Callable[[bytes], T]) -> Callable[[bytes], T | None]:
    """A request deserializer that answers None for bytes that do not parse (the handler then
    refuses them with INVALID_ARGUMENT; gRPC would answer INTERNAL)."""

    def parse_or_none(data: bytes) -> T | None:
        try:
            return parse(data)
        except Exception:  # noqa: BLE001 — protobuf's DecodeError, invalid UTF-8 in a string field
            return None

    return parse_or_none


class ShardStreamService:
    """The control plane of one server process, over its stream runtime."""

    def __init__(self, runtime: StreamRuntime) -> None:
        self.runtime = runtime
        self.registry = runtime.registry
        self.port = 0  # the port the server listens on, once bound (server/lifecycle.py)

    # --- plumbing ------------------------------------------------------------------------------
    def handler(self) -> grpc.GenericRpcHandler:
        """One generic handler: the control plane (Read streams are the Flight data plane's)."""
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "GetDataset": grpc.unary_unary_rpc_method_handler(
                    self._unary("GetDataset", self.get_dataset),
                    request_deserializer=_lenient(pb.GetDatasetRequest.FromString),
                    response_serializer=pb.DatasetInfo.SerializeToString,
                ),
                "ListDatasets": grpc.unary_unary_rpc_method_handler(
                    self._unary("ListDatasets", self.list_datasets),
                    request_deserializer=_lenient(pb.ListDatasetsRequest.FromString),
                    response_serializer=pb.ListDatasetsResponse.SerializeToString,
                ),
            },
        )

    async def _abort(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        exc: BaseException,
    ) -> None:
        code, details, metadata = self.runtime.status_of(method, exc)
        await context.abort(code, details, trailing_metadata=metadata)

    def _principal(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller (policy/auth.py); UnauthenticatedError when the server has --auth and it is nobody known."""
        return self.runtime.auth.authenticate(context.invocation_metadata(), context.auth_context())

    def _unary(
        self, method: str, fn: Callable[[Any, Principal, grpc.aio.ServicerContext | None], Awaitable[T]]
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[T]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> T:
            principal = None
            try:
                await context.send_initial_metadata(VERSION_METADATA)
                principal = self._principal(context)
                if request is None:
                    raise InvalidArgumentError(f"the {method} request does not parse")
                return await fn(request, principal, context)
            except Exception as exc:  # noqa: BLE001 — mapped to a status in _abort
                if isinstance(exc, (UnauthenticatedError, PermissionDeniedError)):
                    dataset = getattr(request, "dataset", "")
                    audit_call(method, principal.name if principal else "-", dataset, exc.grpc_code.name, context.peer())
                await self._abort(method, context, exc)
                raise AssertionError("unreachable: abort raises") from exc

        return handle

    # --- control plane -------------------------------------------------------------------------
    async def get_dataset(
        self,
        request: pb.GetDatasetRequest,
        principal: Principal = OPEN,
        context: grpc.aio.ServicerContext | None = None,
    ) -> pb.DatasetInfo:
        manifest = await asyncio.to_thread(self.runtime.planner.resolve, request.dataset, principal)
        placement = self.runtime.placement  # a supervisor's worker names the least busy worker's port
        info = dataset_info(manifest, placement.data_port() if placement is not None else self.runtime.data_port)
        grant = self._grant(principal, context)
        if grant is not None:
            info.data_grant = grant  # the data plane cannot see the certificate
            info.data_grant_ttl_s = GRANT_TTL_S
        return info

    def _grant(self, principal: Principal, context: grpc.aio.ServicerContext | None) -> bytes | None:
        """A grant for a caller this call authenticated by its client certificate (not by a token),
        bound to that certificate's fingerprint (policy/grants.py); None for any other caller."""
        grants = self.runtime.grants
        if grants is None or not self.runtime.auth.enabled or principal.subject is None or context is None:
            return None
        if has_token(context.invocation_metadata()):
            return None  # a token's caller sends its token to the data plane too
        cert = peer_fingerprint(context.auth_context())
        return None if cert is None else grants.issue(principal, cert)

    async def list_datasets(
        self,
        request: pb.ListDatasetsRequest,
        principal: Principal = OPEN,
        context: grpc.aio.ServicerContext | None = None,
    ) -> pb.ListDatasetsResponse:
        if request.data_plane_only:  # a Checkpointer's discovery: the data plane, no manifest read
            return self._with_grant(pb.ListDatasetsResponse(data_port=self.runtime.data_port), principal, context)
        listing = await asyncio.to_thread(self.registry.listing)
        REGISTRY_BAD_ENTRIES.set(len(listing.bad))
        for bad in listing.bad:
            self._report(bad)
        readable = [m for m in listing.manifests if principal.may_read(m.name, m.version)]
        response = pb.ListDatasetsResponse(
            datasets=[dataset_info(m, self.runtime.data_port) for m in readable], data_port=self.runtime.data_port
        )
        return self._with_grant(response, principal, context)

    def _with_grant(
        self, response: pb.ListDatasetsResponse, principal: Principal, context: grpc.aio.ServicerContext | None
    ) -> pb.ListDatasetsResponse:
        grant = self._grant(principal, context)  # a certificate's caller: for the checkpoint calls
        if grant is not None:
            response.data_grant = grant
            response.data_grant_ttl_s = GRANT_TTL_S
        return response

    def _report(self, bad: BadEntry) -> None:
        if self.runtime.log_once(f"{bad.ref}: {bad.reason}"):
            log.warning(
                "registry entry %s (%s) is unreadable, skipped by ListDatasets: %s%s",
                bad.ref,
                self.registry.storage.url_of(bad.key) if bad.key else bad.name,
                bad.reason,
                f" ({bad.detail})" if bad.detail else "",
            )

def dataset_info(m: Manifest, data_port: int = 0) -> pb.DatasetInfo:
    """A manifest as GetDataset and ListDatasets answer it (with the server's Flight data port)."""
    return pb.DatasetInfo(
        name=m.name,
        version=m.version,
        fingerprint=m.fingerprint,
        num_rows=m.num_rows,
        num_shards=len(m.shards),
        num_bytes=m.num_bytes,
        fields=[pb.Field(name=n, type=t) for n, t in m.fields],
        arrow_schema=plain_schema(m.schema).serialize().to_pybytes(),  # no extension type a client would revive
        data_port=data_port,
    )
