"""A Read query's schedules (DESIGN §7): its batch-size phases, skip ranges and mixture phases as
the pure objects the plan uses (shardstream/order/schedule.py, shardstream/order/curriculum.py).

A request without them gets exactly what it got before schedules existed: no Schedule (a plain
StepLayout) and a plain MixturePlan. Sizes were bounded when the request was decoded (shardstream/order/read_query.py); order and meaning are
checked here, by the constructors, as INVALID_ARGUMENT naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardstream.manifest import Manifest
from shardstream.order.curriculum import MixtureSchedule
from shardstream.order.mixture import MixturePlan, SourceInfo, parse_mixture
from shardstream.order.read_query import ReadQuery
from shardstream.order.schedule import Schedule, merge_ranges

__all__ = ["mixture_weights", "request_mixture", "request_schedule"]


def request_schedule(query: ReadQuery) -> Schedule | None:
    """The query's batch-size phases and skip ranges; None when it has neither."""
    if not query.batch_schedule and not query.skips:
        return None
    batch = [(p.start, p.batch_size) for p in query.batch_schedule] or query.batch_size
    return Schedule.of(batch, merge_ranges((r.start, r.end) for r in query.skips))


def mixture_weights(query: ReadQuery) -> list[tuple[str, float]]:
    """The mixture's (source, weight), checked before any source is resolved; with mixture_phases
    the weights are the phases' (each source's `weight` is 0 then) and only the names are checked."""
    if query.mixture_phases:
        parse_mixture([(s.dataset, 1.0) for s in query.sources])  # names, each once
        return [(s.dataset, 0.0) for s in query.sources]
    return parse_mixture([(s.dataset, s.weight) for s in query.sources])


def request_mixture(
    query: ReadQuery, manifests: Sequence[Manifest], weights: Sequence[tuple[str, float]]
) -> MixturePlan | MixtureSchedule:
    """The query's mixture over its resolved sources: plain weights, or phases (mixture_phases)."""
    if not query.mixture_phases:
        return MixturePlan(
            [
                SourceInfo(m.ref, m.fingerprint, m.num_rows, w)
                for m, (_, w) in zip(manifests, weights, strict=True)
            ],
            query.seed,
            query.mixture_block,
            query.mixture_epoch_samples,
        )
    return MixtureSchedule(
        [SourceInfo(m.ref, m.fingerprint, m.num_rows, 0.0) for m in manifests],
        [(p.start, list(p.weights)) for p in query.mixture_phases],
        query.seed,
        query.mixture_block,
        query.mixture_epoch_samples,
    )
