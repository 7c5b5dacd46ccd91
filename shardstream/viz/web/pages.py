"""The navigation pages: datasets -> versions (history) -> a version (schema, modality, ways to look at
it) and diffs; jobs from the cursor store; the fleet's health and load."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from shardstream.order.explain import Cursor
from shardstream.order.read_order import StepLayout

from ..catalog import presets
from ..fleet_status import job_checkpoints, job_steps, list_jobs
from ..query import StepQuery
from ..step_time import explain
from . import links
from .state import Viz

__all__ = ["datasets", "diff", "fleet", "job", "jobs", "version", "versions"]


def _viz(request: Request) -> Viz:
    return request.app.state.viz  # type: ignore[no-any-return]


def datasets(request: Request) -> Response:
    viz = _viz(request)
    return viz.page(request, "datasets.html", title="Datasets", rows=viz.catalog.datasets())


def versions(request: Request) -> Response:
    viz = _viz(request)
    name = request.path_params["name"]
    rows = viz.catalog.versions(name)
    return viz.page(request, "versions.html", title=f"{name}: versions", name=name, rows=rows)


def version(request: Request) -> Response:
    viz = _viz(request)
    row = viz.catalog.version(request.path_params["ref"])
    looks = [
        (label, links.step_url(StepQuery(row.ref, transforms=tf, world_size=1, batch_size=8)))
        for label, tf in presets(row)
    ]
    base = StepQuery(row.ref)
    return viz.page(
        request,
        "version.html",
        title=row.ref,
        row=row,
        looks=looks,
        stats=links.stats_url(base) if viz.catalog.registry is not None else None,
        parent_diff=links.diff_url(f"{row.name}@{row.parent}", row.ref) if row.parent else None,
    )


def diff(request: Request) -> Response:
    viz = _viz(request)
    a, b = request.query_params.get("a", ""), request.query_params.get("b", "")
    d = viz.catalog.diff(a, b)
    return viz.page(request, "diff.html", title=f"{d['old']} → {d['new']}", d=d)


def jobs(request: Request) -> Response:
    viz = _viz(request)
    return viz.page(request, "jobs.html", title="Jobs", store=viz.store, rows=list_jobs(viz.store))


def _shuffle(text: str) -> tuple[str, int]:
    """'block(window=16)' -> ('block', 16); 'full' -> ('full', 0)."""
    if text.startswith("block(window="):
        return "block", int(text.removeprefix("block(window=").rstrip(")"))
    return text, 0


def _cursor(state: Any) -> Cursor:
    return Cursor(state.epoch, state.offset, state.steps, state.world_size, state.batch_size, state.drop_last)


def _token(viz: Viz) -> str:
    """The web's own bearer token (its call metadata), for the Checkpointer: "" for none."""
    auth = dict(viz.source.security.metadata).get("authorization", "")
    return auth.removeprefix("Bearer ")


def job(request: Request) -> Response:
    """Each checkpoint's step as the job counts it: the step the checkpoint's cursor starts (the job's
    step S, counted from 0 like `explain --job --step S`) on the ranks of the run that committed it,
    each rank's positions and a link to what it received there, with the job's columns and transforms.
    Then the step time explained per checkpoint and rank (data wait, waiting for the slowest rank,
    checkpoint stall: viz/step_time.py), and the job's checkpoints the fleet keeps (step, size, age,
    data position), when it keeps them."""
    viz = _viz(request)
    name = request.path_params["job"]
    steps = job_steps(viz.store, name)
    rows = []
    for st in steps:
        if not st.ranks:
            continue
        s = st.ranks[0]["state"]
        mode, window = _shuffle(s.shuffle)
        base = StepQuery(
            s.dataset,
            seed=s.seed,
            shuffle=mode,
            window=window,
            epoch=s.epoch,
            columns=",".join(s.columns or ()),
            transforms=json.dumps(list(s.transforms)) if s.transforms else "",
            on_error=s.on_error,
            drop_last=s.drop_last,
            balance=StepQuery.balance_of(s.balance),
        )
        num_rows = viz.source.target(base).num_rows
        run = _cursor(s)  # the world and batch size of the run that committed it, as explain walks it
        ranks = []
        for r in range(run.world_size):
            q = base.moved(
                world_size=run.world_size,
                batch_size=run.batch_size,
                drop_last=run.drop_last,
                rank=r,
                step=s.steps,
                cursor=f"{s.steps}:{s.epoch}:{s.offset}",
            )
            layout = StepLayout(num_rows, s.offset, run.world_size, run.batch_size, run.drop_last)
            # under balance= a rank's samples are its share of the step's, not a range: the step's shown
            lo, hi = layout.global_range(0) if base.balance else layout.rank_range(0, r)
            ranks.append(
                {"rank": r, "world_size": run.world_size, "positions": (lo, hi), "url": links.step_url(q), "balanced": bool(base.balance)}
            )
        rows.append(
            {
                "checkpoint": st.step,
                "committed": st.committed,
                "step": s.steps,
                "dataset": s.dataset,
                "epoch": s.epoch,
                "offset": s.offset,
                "committed_by": (s.world_size, s.batch_size),
                "run": (run.world_size, run.batch_size),
                "schedule": bool(s.schedule),
                "balance": base.balance,
                "columns": s.columns,
                "ranks": ranks,
                "step_time": explain(st.ranks),  # what each rank recorded with this commit
            }
        )
    checkpoints, why_none = job_checkpoints(viz.source.endpoints, name, tls=viz.source.tls, token=_token(viz))
    return viz.page(
        request,
        "job.html",
        title=f"job {name}",
        job=name,
        store=viz.store,
        rows=rows,
        checkpoints=checkpoints,
        why_no_checkpoints=why_none,
    )


def fleet(request: Request) -> Response:
    viz = _viz(request)
    return viz.page(request, "fleet.html", title="Fleet", servers=viz.fleet.status())
