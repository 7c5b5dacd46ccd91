"""`explain DATASET --sample SHARD:ROW`: where one stored row lands in an epoch, from the plan alone.

The row's place among the rows the version holds (a drop_rows version's masked row is never
delivered), its position in the epoch's order (`find_position`), then the step, rank and index in
the batch that position falls in (`place_of`). In a mixture or mixture phases (--source NAME@V):
every time that mixture epoch takes the row — the source epochs its samples of the source come from,
the row's place in each one's order, and that count's stream position (`position_of`, the plan's
position -> (source, row) lookup inverted: O(phases) + one block). The command is explain_command.py's.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from shardstream.errors import InvalidArgumentError, NotFoundError
from shardstream.order.curriculum import is_mixture_schedule, parse_mixture_schedule, schedule_sources
from shardstream.order.delivery import Selector, make_selector
from shardstream.order.explain import find_position, place_of
from shardstream.order.mixture import MixtureOrder, is_mixture, parse_mixture
from shardstream.order.read_order import ShuffleSpec, StepLayout
from shardstream.registry import Registry

from . import common

__all__ = ["explain_sample"]


def explain_sample(args: argparse.Namespace) -> dict[str, Any]:
    """`explain DATASET --sample SHARD:ROW`: where the row lands in the epoch (each time, in a mixture)."""
    shard_text, sep, row_text = args.sample.rpartition(":")
    if not sep or not shard_text or not row_text.isdigit():
        raise InvalidArgumentError(
            f"--sample must be SHARD:ROW (a shard index or uri, a row in it), got {args.sample!r}"
        )
    spec = ShuffleSpec.parse(args.shuffle, args.window)
    with common.open_registry(args) as reg:
        if is_mixture_schedule(args.dataset) or is_mixture(args.dataset):
            sel, source = _sample_mixture(reg, args, spec)
        else:
            sel, source = make_selector([reg.resolve(args.dataset)], None, seed=args.seed, shuffle=spec), 0
    m = sel.manifests[source]
    uris = [s.uri for s in m.shards]
    if shard_text.isdigit() and int(shard_text) < len(uris):
        shard = int(shard_text)
    else:
        found = [i for i, u in enumerate(uris) if u == shard_text or u.rsplit("/", 1)[-1] == shard_text]
        if len(found) != 1:
            raise NotFoundError(
                f"{m.ref} has no shard {shard_text!r} (shards 0..{len(uris) - 1}, or their uris)"
            )
        shard = found[0]
    row = int(row_text)
    if row >= m.shards[shard].rows:
        raise InvalidArgumentError(
            f"shard {shard} ({uris[shard]}) of {m.ref} has {m.shards[shard].rows} rows"
        )
    layout = StepLayout(sel.num_rows, args.offset, args.world_size, args.batch_size, args.drop_last)
    per_epoch = StepLayout(sel.num_rows, 0, args.world_size, args.batch_size, args.drop_last).num_steps
    out: dict[str, Any] = {
        "dataset": sel.label if sel.is_mixture else m.ref,
        **({"source": m.ref} if sel.is_mixture else {}),
        "shard": shard,
        "shard_uri": uris[shard],
        "row": row,
        "dataset_row": None,
        "config": f"seed {args.seed}, shuffle {spec}, world size {args.world_size}, batch size {args.batch_size}"
        f"{', drop_last' if args.drop_last else ''}{f', from offset {args.offset}' if args.offset else ''}",
        "epoch": args.epoch,
        "position": None,
        "step": None,
        "rank": None,
        "index_in_batch": None,
        "job_step": None,
    }
    # the rows the version holds: a drop_rows version's masked rows have no position in its order
    dataset_row = int(sel.locators[source].row_index(np.asarray([shard]), np.asarray([row]))[0])
    if dataset_row < 0:
        out["note"] = f"masked: {m.ref} does not hold this row (drop_rows); it is never delivered"
        return out
    out["dataset_row"] = dataset_row
    positions: list[tuple[int, int | None]]
    if isinstance(sel.order, MixtureOrder):
        positions = [*_mixture_positions(sel.order, source, m.num_rows, dataset_row, args.epoch)]
    else:
        positions = [(find_position(sel.order.epoch(args.epoch).rows, m.num_rows, dataset_row), None)]
    places = []
    for position, source_epoch in positions:
        place: dict[str, Any] = {"position": position, "step": None, "rank": None, "index_in_batch": None}
        if source_epoch is not None:
            place["source_epoch"] = source_epoch
        where = place_of(layout, position)
        if where is not None:
            step, rank = where
            place.update(step=step, rank=rank, index_in_batch=position - layout.rank_range(step, rank)[0])
            place["job_step"] = args.epoch * per_epoch + step if not args.offset else None
        else:
            place["note"] = (
                "dropped: in the epoch's incomplete last step (drop_last)"
                if position >= args.offset
                else f"before --offset {args.offset}: not delivered by a stream started there"
            )
        places.append(place)
    if sel.is_mixture:
        out["occurrences"] = places
    if places:
        out.update(places[0])
    else:
        out["note"] = (
            f"the mixture takes no sample of {m.ref}'s that epoch holds this row in mixture epoch {args.epoch}"
        )
    return out


def _sample_mixture(reg: Registry, args: argparse.Namespace, spec: ShuffleSpec) -> tuple[Selector, int]:
    """The mixture (or mixture phases) of --sample, and the index of its --source."""
    if is_mixture_schedule(args.dataset):
        refs, phases = schedule_sources(parse_mixture_schedule(args.dataset))
        weights = None
    else:
        pairs = parse_mixture(args.dataset)
        refs, phases, weights = [r for r, _ in pairs], None, [w for _, w in pairs]
    sel = make_selector(
        [reg.resolve(ref) for ref in refs],
        weights,
        seed=args.seed,
        shuffle=spec,
        mixture_block=args.mixture_block,
        epoch_samples=args.mixture_epoch_samples,
        phases=phases,
    )
    if args.source is None:
        raise InvalidArgumentError(f"--sample in a mixture needs --source (one of {', '.join(refs)})")
    names = [m.ref for m in sel.manifests]
    hits = [i for i, (ref, full) in enumerate(zip(refs, names, strict=True)) if args.source in (ref, full)]
    if len(hits) != 1:
        raise NotFoundError(f"--source {args.source!r} is not a source of {args.dataset} ({', '.join(refs)})")
    return sel, hits[0]


def _mixture_positions(
    mix: MixtureOrder, source: int, n: int, dataset_row: int, epoch: int
) -> list[tuple[int, int]]:
    """(position in mixture epoch `epoch`, source epoch) of each time the mixture takes the source's
    row there: the source epochs that epoch's samples of the source come from, the row's place in
    each one's order, and that sample's stream position (`position_of`: the plan's lookup inverted)."""
    plan, order = mix.plan, mix.orders[source]
    total = plan.epoch_samples
    lo, hi = (int(plan.taken_before(e * total)[source]) for e in (epoch, epoch + 1))
    out = []
    for source_epoch in range(lo // n, -(-hi // n)):
        count = source_epoch * n + find_position(order.epoch(source_epoch).rows, n, dataset_row)
        if lo <= count < hi:
            g = plan.position_of(source, count)
            assert g is not None and epoch * total <= g < (epoch + 1) * total, (count, g)
            out.append((g - epoch * total, source_epoch))
    return sorted(out)
