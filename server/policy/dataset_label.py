"""The `dataset` label of the server's metrics: a dataset's name, from a bounded set.

Streams, rows, bytes, stream errors and transform times are labelled with the dataset they read, so
a dashboard shows which dataset is hot or failing. The label is the name only — never the version,
a tag or a path — and a mixture is its sources' names joined by "+" in sorted order ("code+web").

A label's values must stay few (each is a time series per metric and per process), yet datasets are
whatever the registry holds. So each process admits at most MAX_DATASET_LABELS distinct values,
first come first served, and folds every later one into OTHER ("_other": no dataset name starts
with "_"). A value is admitted only once its stream was planned (the dataset resolved): names that
do not resolve — typos, probes — never take a place, and a stream that fails before planning is
labelled with its name only when that name is admitted already, else OTHER. The set is per process
and lives as long as it does, so with several workers a dataset may be named in one and folded in
another; sums over `dataset` stay exact.
"""

from __future__ import annotations

import threading

from shardstream.errors import ShardstreamError
from shardstream.manifest import DatasetRef
from shardstream.order.mixture import is_mixture, parse_mixture

__all__ = ["MAX_DATASET_LABELS", "OTHER", "dataset_label", "dataset_name", "names_label"]

MAX_DATASET_LABELS = 64  # distinct `dataset` values per process; the rest are OTHER
OTHER = "_other"

_lock = threading.Lock()
_admitted: set[str] = set()


def dataset_name(dataset: str, sources: list[str] | None = None) -> str:
    """The label's candidate value for a request: 'web@3' -> 'web', a mixture -> 'code+web'.

    `sources` are a mixture request's dataset strings; '' when nothing parses."""
    try:
        if sources:
            names = {DatasetRef.parse(s).name for s in sources}
        elif is_mixture(dataset):
            names = {DatasetRef.parse(ref).name for ref, _ in parse_mixture(dataset)}
        else:
            names = {DatasetRef.parse(dataset).name}
    except (ShardstreamError, ValueError, TypeError):
        return ""
    return "+".join(sorted(names))


def names_label(names: list[str]) -> str:
    """The candidate value for a planned stream, from its manifests' names (valid already: not
    parsed again): 'web', or a mixture's sorted and joined 'code+web'."""
    return "+".join(sorted(set(names)))


def dataset_label(name: str, *, admit: bool) -> str:
    """`name` if it is (or, with `admit`, may become) one of this process's label values, else OTHER."""
    if not name:
        return OTHER
    with _lock:
        if name in _admitted:
            return name
        if admit and len(_admitted) < MAX_DATASET_LABELS:
            _admitted.add(name)
            return name
    return OTHER
