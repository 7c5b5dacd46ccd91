"""The script that reproduces a step in a trainer: "Copy as Python" on the web's step page.

`script(query, endpoints, state)` is a complete program: the import, the endpoints the visualizer
reads through, the dataset (pinned version or mixture), every Loader option the step depends on
(seed, shuffle and window, world size, rank, batch size, columns, transforms, on_error, drop_last,
the epochs to run) and the Loader state after which the step shown is the next one. After it runs,
`batch` holds that step's batch as `Loader(output="numpy")` hands it over — the arrays the page
draws. Values are Python literals (`repr`), never JSON: `None`, `True`, `False`.

A bearer token is never written into it: the Loader reads `$SHARDSTREAM_TOKEN` when `token=` is not
given, and the script says so when the fleet needs one. TLS options are file paths, written as given.
"""

from __future__ import annotations

import pprint
from collections.abc import Mapping, Sequence
from typing import Any

from .query import StepQuery

__all__ = ["script"]

WIDTH = 100


def _literal(value: Any, indent: int) -> str:
    text = pprint.pformat(value, width=WIDTH - indent, sort_dicts=True)
    return text.replace("\n", "\n" + " " * indent)


def script(
    query: StepQuery,
    endpoints: Sequence[str],
    state: Mapping[str, Any],
    *,
    tls: Any = None,
    token: bool = False,
) -> str:
    """The Python program whose variable `batch` ends up holding `query`'s step (see the module docstring)."""
    kwargs = {k: v for k, v in query.loader_kwargs().items() if v is not None or k == "columns"}
    kwargs["epochs"] = int(state["epoch"]) + 1  # epochs count from 0: run until the step's epoch is done
    kwargs["output"] = "numpy"
    if tls:
        kwargs["tls"] = dict(tls) if isinstance(tls, Mapping) else tls
    args = "\n".join(f"    {k}={_literal(v, 4 + len(k) + 1)}," for k, v in kwargs.items())
    need_token = "# the fleet needs a token: the Loader reads $SHARDSTREAM_TOKEN (or pass token=...)\n" if token else ""
    return (
        f'"""{query.describe()}: the batch `shardstream web` showed."""\n'
        "from shardstream.client import Loader\n"
        "\n"
        f"endpoints = {_literal(list(endpoints), 12)}\n"
        f"dataset = {query.dataset!r}\n"
        f"# Loader.state_dict() just before step {query.step} (epoch {state['epoch']}, offset {state['offset']}): "
        "its next batch is that step\n"
        f"state = {_literal(dict(state), 8)}\n"
        f"{need_token}"
        "\n"
        "with Loader(\n"
        "    endpoints,\n"
        "    dataset,\n"
        f"{args}\n"
        ") as loader:\n"
        "    loader.load_state_dict(state)\n"
        f"    batch = next(iter(loader))  # dict of numpy arrays: rank {query.rank}'s batch at step {query.step}\n"
        "\n"
        "print({name: getattr(value, 'shape', None) for name, value in batch.items()})\n"
    )
