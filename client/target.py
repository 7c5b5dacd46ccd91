"""What a Loader reads: one pinned dataset version, a pinned weighted mixture of them, or mixture
phases over pinned versions (a curriculum: shardstream/order/curriculum.py).

Pure, no I/O and no callbacks: `normalize_dataset` checks the argument once (the one
`DatasetRef.parse` of each ref on the client), `dataset_refs` says which refs to look up, and
`target_of` pins the target from the servers' answers. The look-ups themselves are the caller's
(a Loader's or StepReader's Fleet: transport/fleet.py, find_dataset), one GetDataset per ref."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardstream.errors import InvalidArgumentError
from shardstream.manifest import DatasetRef
from shardstream.order.curriculum import (
    MixtureSchedule,
    is_mixture_schedule,
    parse_mixture_schedule,
    schedule_sources,
)
from shardstream.order.mixture import MixturePlan, SourceInfo, is_mixture, parse_mixture
from shardstream.order.read_query import MixturePhase, ReadQuery, Source
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["Target", "dataset_refs", "normalize_dataset", "target_of"]


Phases = list[tuple[int, list[tuple[str, float]]]]


def normalize_dataset(dataset: object) -> str | list[tuple[str, float]] | Phases:
    """A dataset ref (validated), the mixture's [(ref, weight)], or mixture phases [(offset, [(ref,
    weight)])] (one phase is a plain mixture); raises before any network call."""
    if is_mixture_schedule(dataset):
        phases = parse_mixture_schedule(dataset)
        return phases[0][1] if len(phases) == 1 else phases
    if is_mixture(dataset):
        return parse_mixture(dataset)  # type: ignore[arg-type]
    if not isinstance(dataset, str):
        raise InvalidArgumentError(f"dataset must be 'NAME[@VERSION]' or a mixture, got {dataset!r}")
    return str(DatasetRef.parse(dataset))


@dataclass(frozen=True)
class Target:
    label: str  # "name@version", or "a@1:0.7,b@2:0.3" for a mixture
    fingerprint: str
    num_rows: int  # samples per epoch
    fields: list[str]
    sources: list[pb.DatasetInfo]
    mixture: MixturePlan | MixtureSchedule | None

    def query(self, **fields: Any) -> ReadQuery:
        """The read of this target with `fields` (the order, the slice, the output: ReadQuery's)."""
        if self.mixture is None:
            info = self.sources[0]
            return ReadQuery(sources=(Source(f"{info.name}@{info.version}", info.fingerprint),), **fields)
        phases = isinstance(self.mixture, MixtureSchedule)
        return ReadQuery(
            sources=tuple(
                Source(src.ref, info.fingerprint, 0.0 if phases else src.weight)
                for src, info in zip(self.mixture.sources, self.sources, strict=True)
            ),
            mixture=True,
            mixture_phases=tuple(
                MixturePhase(start, tuple(weights))
                for start, weights in (self.mixture.requested if isinstance(self.mixture, MixtureSchedule) else ())
            ),
            mixture_block=self.mixture.block_size,
            mixture_epoch_samples=self.mixture.epoch_samples,
            **fields,
        )


def dataset_refs(dataset: str | list[tuple[str, float]] | Phases) -> list[str]:
    """The refs a normalized dataset names, each once, in order (a mixture's sources; every source of
    any phase, in order of first appearance): what `target_of` needs the DatasetInfo of."""
    if isinstance(dataset, str):
        return [dataset]
    if isinstance(dataset[0][0], int):
        return schedule_sources(dataset)[0]  # type: ignore[arg-type]
    return [r for r, _ in dataset]  # type: ignore[misc]


def target_of(
    dataset: str | list[tuple[str, float]] | Phases,
    infos: Sequence[pb.DatasetInfo],
    *,
    columns: Sequence[str] | None,
    seed: int,
    mixture_block: int = 0,
    mixture_epoch_samples: int = 0,
) -> Target:
    """The pinned target of a normalized `dataset`, from `infos`: the DatasetInfo of each of
    `dataset_refs(dataset)`, in that order. Checks `columns` against every source."""
    phases = None
    if not isinstance(dataset, str) and isinstance(dataset[0][0], int):
        phases = schedule_sources(dataset)[1]  # type: ignore[arg-type]
    infos = list(infos)
    assert len(infos) == len(dataset_refs(dataset)), "one DatasetInfo per ref of dataset_refs(dataset)"
    names = [f.name for f in infos[0].fields]
    for info in infos:
        have = [f.name for f in info.fields]
        wanted = list(columns) if columns is not None else names
        unknown = [c for c in wanted if c not in have]
        if unknown:
            raise InvalidArgumentError(
                f"unknown column(s) {', '.join(map(repr, unknown))} in {info.name}@{info.version}; "
                f"columns are: {', '.join(have)}"
            )
    if isinstance(dataset, str):
        info = infos[0]
        return Target(f"{info.name}@{info.version}", info.fingerprint, info.num_rows, names, infos, None)
    if phases is not None:
        sched = MixtureSchedule(
            [SourceInfo(f"{i.name}@{i.version}", i.fingerprint, i.num_rows, 0.0) for i in infos],
            phases,
            seed,
            mixture_block,
            mixture_epoch_samples,
        )
        return Target(sched.label, sched.fingerprint, sched.epoch_samples, names, infos, sched)
    plan = MixturePlan(
        [
            SourceInfo(f"{i.name}@{i.version}", i.fingerprint, i.num_rows, w)
            for i, (_, w) in zip(infos, dataset, strict=True)
        ],
        seed,
        mixture_block,
        mixture_epoch_samples,
    )
    return Target(plan.label, plan.fingerprint, plan.epoch_samples, names, infos, plan)
