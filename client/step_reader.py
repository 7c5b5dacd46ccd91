"""`StepReader`: one rank's batch at any one step of a read, exactly as a Loader with the same options
gets it — without reading the steps before it. The visualizers' data source (shardstream/viz/).

    with StepReader(["10.0.0.5:7070"]) as reader:
        batch, info = reader.read("web@3", epoch=0, offset=0, batch_size=32, world_size=8, rank=3)
    batch, info = read_step(["10.0.0.5:7070"], "web@3", step=12, rank=3, batch_size=32, world_size=8)

The keyword options are a Loader's (`LoaderOptions`, loader_options.py): the read spec is theirs
(`LoaderOptions.read_spec`), with Arrow output and the provenance columns; the read goes over one
`StreamSession` (transport/session.py: its retries and failover, on the options' RetryPolicy) that asks for one
step (`num_steps = 1`) starting where a Loader whose state says (epoch, offset) starts: `state()` is
that Loader state. A dataset is resolved once per (dataset, columns, seed, mixture options) and then
pinned (`target`): its GetDataset asks the endpoints in turn on the same RetryPolicy as the read, with
its backoff and budget (`Fleet.find_dataset`, as a Loader's); `list_datasets` asks each endpoint once,
in the same loop (`Fleet.ask`: transport/fleet.py).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from shardstream.errors import UnavailableError
from shardstream.order.cursor_math import NO_SPLIT
from shardstream.order.read_order import StepLayout
from shardstream.v1 import shardstream_pb2 as pb

from .batch import PROVENANCE, BatchInfo
from .convert import to_numpy
from .credentials import ChannelSecurity, TlsOption
from .decode import decode_message
from .loader_options import LoaderOptions
from .loader_state import LoaderState
from .spec import RetryPolicy
from .target import Target, dataset_refs, normalize_dataset, target_of
from .transport.channel import normalize_endpoints
from .transport.fleet import Fleet
from .transport.session import CallRegistry, StreamSession

__all__ = ["DEFAULT_READ_DEADLINE_S", "DEFAULT_TIMEOUT_S", "StepReader", "as_numpy", "read_step"]

DEFAULT_TIMEOUT_S = 30.0  # a control-plane call; the read's retry budget (the options' timeout_s)
DEFAULT_READ_DEADLINE_S = 300.0  # one step of large samples (64 videos) may take a while on a busy server


class StepReader:
    """Steps of any (dataset, options, rank, epoch, offset) from a fleet (see the module docstring)."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        tls: TlsOption = None,
        token: str | None = None,
        security: ChannelSecurity | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        read_deadline_s: float = DEFAULT_READ_DEADLINE_S,
    ) -> None:
        self.endpoints = normalize_endpoints(endpoints)
        self.security = security or ChannelSecurity.from_options(tls, token)
        self.timeout_s = timeout_s
        self.read_deadline_s = read_deadline_s
        # the one session with the fleet (transport/fleet.py); a read retries on the options' RetryPolicy
        self._fleet = Fleet(self.endpoints, self.security, RetryPolicy(budget_s=timeout_s), owner="StepReader")
        self._targets: dict[tuple[Any, ...], Target] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> StepReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._fleet.close()

    # --- what there is ---------------------------------------------------------------------------
    def list_datasets(self) -> list[pb.DatasetInfo]:
        """Each dataset's latest version, as the first server that answers lists it (by name). Each
        endpoint is asked once, in turn, with the policy's backoff between them (Fleet.ask on a
        one-pass policy): the visualizers' reachability check says a fleet that does not answer at once."""
        one_pass = replace(self._fleet.retry, max_retries=len(self.endpoints) - 1, budget_s=0.0)
        resp = self._fleet.ask(lambda c, _: c.list_datasets(self.timeout_s), retry=one_pass)
        return sorted(resp.datasets, key=lambda d: d.name)

    def dataset_info(self, ref: str) -> pb.DatasetInfo:
        """GetDataset of the first server that answers, on the RetryPolicy (Fleet.find_dataset)."""
        return self._fleet.find_dataset(ref, 0)

    def target(
        self,
        dataset: Any,
        *,
        columns: Sequence[str] | None = None,
        seed: int = 0,
        mixture_block: int = 0,
        mixture_epoch_samples: int = 0,
    ) -> Target:
        """The pinned dataset version or mixture a Loader with these options reads (resolved once)."""
        normal = normalize_dataset(dataset)
        key = (repr(normal), tuple(columns) if columns else None, seed, mixture_block, mixture_epoch_samples)
        with self._lock:
            found = self._targets.get(key)
        if found is None:
            found = target_of(
                normal,
                [self.dataset_info(ref) for ref in dataset_refs(normal)],
                columns=list(columns) if columns else None,
                seed=seed,
                mixture_block=mixture_block,
                mixture_epoch_samples=mixture_epoch_samples,
            )
            with self._lock:
                self._targets[key] = found
        return found

    def options(self, epoch: int, **loader_options: Any) -> LoaderOptions:
        """The Loader options of a read of epoch `epoch`: Arrow with provenance, nothing prefetched."""
        given = {"timeout_s": self.timeout_s, **loader_options}
        return LoaderOptions.of(
            {**given, "output": "arrow", "provenance": True, "prefetch": 1, "streams": 1, "epochs": epoch + 1},
            caller="StepReader.read()",
        )

    def _target_of(self, dataset: Any, o: LoaderOptions) -> Target:
        if isinstance(dataset, Target):
            return dataset
        return self.target(
            dataset,
            columns=o.columns,
            seed=o.seed,
            mixture_block=o.mixture_block,
            mixture_epoch_samples=o.mixture_epoch_samples,
        )

    def state(
        self, dataset: Any, *, epoch: int, offset: int, steps: int = 0, **loader_options: Any
    ) -> dict[str, Any]:
        """The `Loader.state_dict()` after which the step at (epoch, offset) is the next one."""
        o = self.options(epoch, **loader_options)
        target = self._target_of(dataset, o)
        return LoaderState(
            dataset=target.label,
            fingerprint=target.fingerprint,
            seed=o.seed,
            shuffle=str(o.shuffle),
            epoch=epoch,
            offset=offset,
            world_size=o.world_size,  # type: ignore[arg-type]
            batch_size=o.first_batch,
            steps=steps,
        ).to_dict()

    # --- one step --------------------------------------------------------------------------------
    def read(
        self, dataset: Any, *, epoch: int, offset: int, what: str = "", **loader_options: Any
    ) -> tuple[pa.RecordBatch, BatchInfo]:
        """The options' rank's batch at the step that starts at global `offset` of `epoch` (a Loader
        resumed from `state(...)` hands it over first), and its BatchInfo (`step` 0: the read's first).
        `dataset`: what a Loader takes, or a `Target` from `target()`."""
        o = self.options(epoch, **loader_options)
        target = self._target_of(dataset, o)
        spec = o.read_spec(
            target=target, endpoints=self.endpoints, schedule=None, split=NO_SPLIT, origin=(epoch, offset)
        )
        assert o.world_size is not None
        layout = StepLayout(target.num_rows, offset, o.world_size, o.first_batch, o.drop_last)
        what = what or f"{target.label} epoch {epoch} offset {offset} rank {spec.rank}"

        def request_at(first: int) -> pb.ReadRequest:
            request = spec.request(epoch, offset, first, 1)
            request.num_steps = 1
            return request

        def open_call(endpoint: str, request: pb.ReadRequest) -> Any:
            return self._fleet.open_read(endpoint, request, self.read_deadline_s)

        calls = CallRegistry(open_call)
        session = StreamSession(
            calls,
            request_at,
            endpoints=spec.endpoints,
            endpoint=spec.rank % len(spec.endpoints),
            first_step=0,
            step_stride=1,
            retry=spec.retry,
            what=what,
        )
        try:
            message = session.next_message()
        finally:
            session.close()
            calls.stop()
        if message is None:
            raise UnavailableError(f"the stream of {what} ended without its step")
        header, rows = message
        items = [i for i in decode_message(spec, epoch, layout, 0, 1, header, rows) if i.info]
        if len(items) != 1:
            raise UnavailableError(f"expected one step for {what}, got {len(items)}")
        item = items[0]
        assert item.info is not None
        return item.batch, item.info


def read_step(
    endpoints: str | Sequence[str], dataset: Any, step: int, rank: int = 0, **loader_options: Any
) -> tuple[pa.RecordBatch, BatchInfo]:
    """One rank's batch at `step` of the first epoch of a Loader(endpoints, dataset, rank=rank,
    **loader_options), as Arrow with the provenance columns, and its BatchInfo (`step` = step).
    `tls` and `token` are taken as a Loader takes them. Steps are those of a plain read (one batch
    size; a batch-size schedule or skip ranges are refused by the Loader's options only)."""
    security = ChannelSecurity.from_options(loader_options.pop("tls", None), loader_options.pop("token", None))
    timeout_s = loader_options.pop("timeout_s", DEFAULT_TIMEOUT_S)
    with StepReader(endpoints, security=security, timeout_s=timeout_s) as reader:
        o = reader.options(0, rank=rank, **loader_options)
        assert o.world_size is not None
        offset = step * o.world_size * o.first_batch
        batch, info = reader.read(dataset, epoch=0, offset=offset, rank=rank, **loader_options)
    return batch, replace(info, step=step)


def as_numpy(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """A read's batch as `Loader(output="numpy")` hands it over: the data columns as numpy arrays."""
    return to_numpy(batch.drop_columns([c for c in PROVENANCE if c in batch.schema.names]))
