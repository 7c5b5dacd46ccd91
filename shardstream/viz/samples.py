"""A received step -> what each of its rows shows, by modality: the model both visualizers render.

`views(step)` looks at the columns the trainer received (after transforms) and the transforms that
made them, and returns one `ColumnView` per thing to draw: an image tensor, a video's frames, an
audio clip, packed token rows (with their labels and document ids), token lists, RL windows or raw
episodes, encoded media as stored, text, or plain values. Columns a view draws beside its main one
(`labels` beside `input_ids`, `audio_length` beside `audio`) get no view of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .source import StepBatch
from .tokens import tokenizer_of

__all__ = ["ColumnView", "image_hwc", "row_summary", "sniff", "views"]

RL_WINDOW = ("reward", "returns", "done", "valid")
PACKED = ("input_ids", "labels", "position_ids", "document_ids")
MAGIC = (
    (b"\x89PNG", "image", "image/png"),
    (b"\xff\xd8\xff", "image", "image/jpeg"),
    (b"GIF8", "image", "image/gif"),
    (b"RIFF", "riff", ""),  # WAVE or WEBP: decided below
    (b"fLaC", "audio", "audio/flac"),
    (b"ID3", "audio", "audio/mpeg"),
    (b"OggS", "audio", "audio/ogg"),
    (b"\x1a\x45\xdf\xa3", "video", "video/webm"),
)


def sniff(data: bytes) -> tuple[str, str]:
    """(kind, MIME type) of encoded media from its first bytes; ("bytes", "application/octet-stream")."""
    head = bytes(data[:16])
    for magic, kind, mime in MAGIC:
        if head.startswith(magic):
            if kind == "riff":
                return ("image", "image/webp") if head[8:12] == b"WEBP" else ("audio", "audio/wav")
            return kind, mime
    if head[4:8] == b"ftyp":
        return "video", "video/mp4"
    if head[:2] == b"\xff\xfb" or head[:2] == b"\xff\xf3":
        return "audio", "audio/mpeg"
    return "bytes", "application/octet-stream"


@dataclass(frozen=True)
class ColumnView:
    """How to draw one column (with its companions) of every row."""

    kind: str  # image | video | audio | packed | tokens | rl | episode | media | text | value
    column: str
    companions: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)


def _op_outputs(transforms: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    """output column -> the transform that wrote it."""
    out = {}
    for t in transforms:
        col = t.get("output", t.get("column"))
        if t.get("op") == "text.pack":
            col = "input_ids"
        if col:
            out[str(col)] = t
    return out


def views(step: StepBatch) -> list[ColumnView]:
    arrays = step.arrays
    names = list(arrays)
    transforms = step.query.transform_list
    made_by = _op_outputs(transforms)
    tokenizer = tokenizer_of(transforms)
    used: set[str] = set()
    out: list[ColumnView] = []

    def add(view: ColumnView) -> None:
        out.append(view)
        used.update((view.column, *view.companions))

    if "input_ids" in names and {"labels", "document_ids"} <= set(names):
        add(ColumnView("packed", "input_ids", tuple(c for c in PACKED[1:] if c in names), {"tokenizer": tokenizer}))
    if set(RL_WINDOW) <= set(names):
        extra = tuple(c for c in ("obs", "action", "bootstrap", "episode_id", "t0") if c in names)
        add(ColumnView("rl", "reward", (*RL_WINDOW[1:], *extra)))
    elif {"reward", "done"} <= set(names) and arrays["reward"].dtype == object:
        add(ColumnView("episode", "reward", tuple(c for c in ("done", "action") if c in names)))
    for name in names:
        if name in used:
            continue
        arr = arrays[name]
        op = made_by.get(name, {})
        if op.get("op") == "audio.decode" or (arr.ndim == 2 and f"{name}_length" in names):
            rate = int(op.get("sample_rate", 16000))
            add(ColumnView("audio", name, tuple(c for c in (f"{name}_length",) if c in names), {"sample_rate": rate}))
        elif arr.ndim == 5 and arr.dtype == np.uint8:
            add(ColumnView("video", name, tuple(c for c in (f"{name}_frames",) if c in names)))
        elif arr.ndim == 4:
            layout = op.get("layout", "CHW" if arr.shape[1] in (1, 3) and arr.shape[3] not in (1, 3) else "HWC")
            add(ColumnView("image", name, (), {"layout": layout}))
        elif op.get("op") == "text.tokenize" or (tokenizer and arr.dtype == object and _int_lists(arr)):
            add(ColumnView("tokens", name, (), {"tokenizer": tokenizer}))
        elif arr.dtype == object and len(arr) and isinstance(arr[0], bytes | bytearray):
            add(ColumnView("media", name))
        elif arr.dtype == object and len(arr) and isinstance(arr[0], str):
            add(ColumnView("text", name))
        else:
            add(ColumnView("value", name))
    return out


def _int_lists(arr: np.ndarray) -> bool:
    return bool(len(arr)) and isinstance(arr[0], np.ndarray) and arr[0].dtype.kind in "iu"


def image_hwc(pixels: np.ndarray, layout: str) -> np.ndarray:
    """A received image as uint8 [H, W, 3] for display: channels last, grey to RGB, floats rescaled
    from their min..max (normalised tensors) — the same pixels, only mapped to a screen's range."""
    a = np.asarray(pixels)
    if layout == "CHW":
        a = np.moveaxis(a, 0, -1)
    if a.dtype != np.uint8:
        lo, hi = float(a.min()), float(a.max())
        a = ((a - lo) / (hi - lo or 1.0) * 255).round().astype(np.uint8)
    if a.shape[-1] == 1:
        a = np.repeat(a, 3, axis=-1)
    return np.ascontiguousarray(a[..., :3])


def row_summary(step: StepBatch, row: int) -> dict[str, Any]:
    """What a pane states about one row (tests compare it with what a Loader received)."""
    arrays = step.arrays
    out: dict[str, Any] = {"row": row}
    for key in ("id", "idx", "episode", "episode_id", "name"):
        if key in arrays:
            v = arrays[key][row]
            out[key] = v.item() if hasattr(v, "item") else v
    for view in views(step):
        a = arrays[view.column][row]
        if view.kind in ("image", "video"):
            out[view.column] = tuple(int(d) for d in np.shape(a))
        elif view.kind == "audio":
            n = arrays[view.companions[0]][row] if view.companions else len(a)
            out[view.column] = (int(n), view.params["sample_rate"])
        elif view.kind == "packed":
            out["tokens"] = int((arrays["document_ids"][row] >= 0).sum())
        elif view.kind == "tokens":
            out[view.column] = len(a)
        elif view.kind == "rl":
            out["valid_steps"] = int(np.asarray(arrays["valid"][row]).sum())
        elif view.kind == "episode":
            out["steps"] = len(a)
    return out
