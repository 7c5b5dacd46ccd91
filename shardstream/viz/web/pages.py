"""The navigation pages: datasets -> versions (history) -> a version (schema, modality, ways to look at
it) and diffs; jobs from the cursor store; the fleet's health and load."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..catalog import presets
from ..fleet_status import job_steps, list_jobs
from ..query import StepQuery
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


def job(request: Request) -> Response:
    viz = _viz(request)
    name = request.path_params["job"]
    steps = job_steps(viz.store, name)
    rows = []
    for st in steps:
        ranks = []
        for r in st.ranks:
            mode, window = _shuffle(r["shuffle"])
            gb = r["world_size"] * r["batch_size"]
            q = StepQuery(
                r["dataset"],
                seed=r["seed"],
                shuffle=mode,
                window=window,
                world_size=r["world_size"],
                batch_size=r["batch_size"],
                rank=r["rank"],
                step=r["offset"] // gb,
                epoch=r["epoch"],
            )
            ranks.append({**r, "next_step": q.step, "url": links.step_url(q)})
        rows.append({"step": st.step, "committed": st.committed, "ranks": ranks})
    return viz.page(request, "job.html", title=f"job {name}", job=name, store=viz.store, rows=rows)


def fleet(request: Request) -> Response:
    viz = _viz(request)
    return viz.page(request, "fleet.html", title="Fleet", servers=viz.fleet.status())
