"""The dense step view: how a step's rows are laid out, and what is counted above them.

    grid   a row whose one picture is an image (received, or stored as image bytes) and whose other
           values are short: a thumbnail grid, click one to see it large beside the stored original
    table  rows of text and values only: one table row per sample, one column per field
    cards  anything else (tokens, audio, video frames, RL plots): a card per row, as wide as it needs

Mixture rows carry their source's colour (`src0`, `src1`, ...) in every layout, and the counts above
the rows say how many of the step's samples each source, and each label or class value, gave.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ..source import StepBatch

__all__ = ["COUNTED", "counts", "layout_of", "table_columns"]

COUNTED = ("label", "class", "category", "source", "split")  # columns counted per step
MAX_COUNTED_VALUES = 24
PICTURES = ("image", "stored-image")


def layout_of(cards: list[dict[str, Any]]) -> str:
    """'grid', 'table' or 'cards' for a step's cards (the module docstring)."""
    if not cards:
        return "cards"
    kinds = {p["kind"] for c in cards for p in c["panes"]}
    if kinds and kinds <= set(PICTURES) and all(len(c["panes"]) == 1 for c in cards):
        return "grid"
    if kinds <= {"text", "value"} and not any(c["documents"] for c in cards):
        return "table"
    return "cards"


def table_columns(cards: list[dict[str, Any]]) -> list[str]:
    """The columns of the table layout: every field and pane title, in the rows' order."""
    names: dict[str, None] = {}
    for c in cards:
        for k, _ in c["fields"]:
            names.setdefault(k, None)
        for p in c["panes"]:
            names.setdefault(p["column"], None)
    return list(names)


def counts(step: StepBatch) -> list[tuple[str, list[tuple[str, int, str]]]]:
    """Per counted column (and a mixture's sources): (name, [(value, samples, css class)]), most first."""
    out: list[tuple[str, list[tuple[str, int, str]]]] = []
    if step.target.mixture is not None and step.info.sources is not None:
        refs = [f"{s.name}@{s.version}" for s in step.target.sources]
        got = Counter(int(s) for s in step.info.sources.tolist())
        out.append(("source", [(refs[k], got[k], f"s{k % 6}") for k in range(len(refs))]))
    for name in COUNTED:
        values = step.arrays.get(name)
        if values is None or np.ndim(values) != 1:
            continue
        got = Counter(v.item() if hasattr(v, "item") else v for v in values.tolist())
        top = got.most_common(MAX_COUNTED_VALUES)
        out.append((name, [(str(v), n, "") for v, n in top]))
    return out
