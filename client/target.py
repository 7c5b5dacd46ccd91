"""What a Loader reads: one pinned dataset version or a pinned weighted mixture of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from shardstream.errors import InvalidArgumentError
from shardstream.manifest import DatasetRef
from shardstream.mixture import MixturePlan, SourceInfo, is_mixture, parse_mixture
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["Target", "normalize_dataset", "resolve_target"]


def normalize_dataset(dataset: str | Mapping[str, float]) -> str | list[tuple[str, float]]:
    """A dataset ref (validated) or the mixture's [(ref, weight)]; raises before any network call."""
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
    mixture: MixturePlan | None

    def fill(self, request: pb.ReadRequest) -> None:
        """Name what to read in a Read request."""
        if self.mixture is None:
            info = self.sources[0]
            request.dataset = f"{info.name}@{info.version}"
            request.fingerprint = info.fingerprint
            return
        for src, info in zip(self.mixture.sources, self.sources, strict=True):
            request.mixture.add(dataset=src.ref, fingerprint=info.fingerprint, weight=src.weight)
        request.mixture_block = self.mixture.block_size
        request.mixture_epoch_samples = self.mixture.epoch_samples


def resolve_target(
    get_dataset: Callable[[str], pb.DatasetInfo],
    dataset: str | list[tuple[str, float]],
    *,
    columns: Sequence[str] | None,
    seed: int,
    mixture_block: int = 0,
    mixture_epoch_samples: int = 0,
) -> Target:
    refs = [dataset] if isinstance(dataset, str) else [r for r, _ in dataset]
    infos = [get_dataset(r) for r in refs]
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
