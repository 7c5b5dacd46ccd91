"""URLs with the state in them: every page of the web app is a link someone can share."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from ..query import StepQuery

__all__ = ["diff_url", "job_url", "mixture_url", "page_url", "stats_url", "step_url", "version_url", "versions_url"]


def page_url(path: str, **params: object) -> str:
    clean = {k: str(v) for k, v in params.items() if v is not None and v != ""}
    return f"{path}?{urlencode(clean)}" if clean else path


def step_url(q: StepQuery, path: str = "/step", **extra: object) -> str:
    return page_url(path, **q.to_params(), **extra)


def mixture_url(q: StepQuery) -> str:
    return step_url(q, "/mixture")


def stats_url(q: StepQuery) -> str:
    return step_url(q, "/stats")


def versions_url(name: str) -> str:
    return f"/d/{quote(name)}"


def version_url(ref: str) -> str:
    return f"/v/{quote(ref)}"


def diff_url(old: str, new: str) -> str:
    return page_url("/diff", a=old, b=new)


def job_url(job: str) -> str:
    return f"/jobs/{quote(job)}"
