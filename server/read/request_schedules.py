"""A Read request's schedules (DESIGN §7): its batch-size phases, skip ranges and mixture phases as
the pure objects the plan uses (shardstream/order/schedule.py, shardstream/order/curriculum.py).

A request without them gets exactly what it got before schedules existed: no Schedule (a plain
StepLayout) and a plain MixturePlan. Sizes were bounded by request_limits.py; order and meaning are
checked here, by the constructors, as INVALID_ARGUMENT naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardstream.manifest import Manifest
from shardstream.order.curriculum import MixtureSchedule
from shardstream.order.mixture import MixturePlan, SourceInfo, parse_mixture
from shardstream.order.schedule import Schedule, merge_ranges
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["mixture_weights", "request_mixture", "request_schedule"]


def request_schedule(req: pb.ReadRequest) -> Schedule | None:
    """The request's batch-size phases and skip ranges; None when it has neither."""
    if not req.batch_schedule and not req.skip:
        return None
    batch = [(p.start, p.batch_size) for p in req.batch_schedule] or req.batch_size
    return Schedule.of(batch, merge_ranges((r.start, r.end) for r in req.skip))


def mixture_weights(req: pb.ReadRequest) -> list[tuple[str, float]]:
    """The mixture's (source, weight), checked before any source is resolved; with mixture_phases
    the weights are the phases' (each source's `weight` is 0 then) and only the names are checked."""
    if req.mixture_phases:
        parse_mixture([(s.dataset, 1.0) for s in req.mixture])  # names, each once
        return [(s.dataset, 0.0) for s in req.mixture]
    return parse_mixture([(s.dataset, s.weight) for s in req.mixture])


def request_mixture(
    req: pb.ReadRequest, manifests: Sequence[Manifest], weights: Sequence[tuple[str, float]]
) -> MixturePlan | MixtureSchedule:
    """The request's mixture over its resolved sources: plain weights, or phases (mixture_phases)."""
    if not req.mixture_phases:
        return MixturePlan(
            [
                SourceInfo(m.ref, m.fingerprint, m.num_rows, w)
                for m, (_, w) in zip(manifests, weights, strict=True)
            ],
            req.seed,
            req.mixture_block,
            req.mixture_epoch_samples,
        )
    return MixtureSchedule(
        [SourceInfo(m.ref, m.fingerprint, m.num_rows, 0.0) for m in manifests],
        [(p.start, list(p.weights)) for p in req.mixture_phases],
        req.seed,
        req.mixture_block,
        req.mixture_epoch_samples,
    )
