"""One sample's media, made on request from the step its page read: decoded images as PNG, the
stored original bytes, video frame strips, WAV of the received samples and waveform SVGs.

A media URL names a pinned version, the plan parameters, the transforms, the column and the row:
what it returns can never change, so it is sent with an ETag and `Cache-Control: immutable`, and a
revalidation (`If-None-Match`) is answered 304 without reading anything.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from shardstream.errors import InvalidArgumentError

from .. import encode
from ..samples import image_hwc, sniff, views
from ..source import StepBatch
from .state import Viz

__all__ = ["audio_wav", "frames", "image", "original", "waveform"]

CACHE_CONTROL = "public, max-age=31536000, immutable"


def _etag(request: Request) -> str:
    items = sorted(request.query_params.multi_items())
    digest = hashlib.sha256(repr((request.url.path, items)).encode()).hexdigest()[:32]
    return f'"{digest}"'


def _cached(request: Request, make: Any) -> Response:
    """304 when the browser holds this URL already; else `make()` -> (bytes, media type)."""
    etag = _etag(request)
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers={"ETag": etag, "Cache-Control": CACHE_CONTROL})
    body, media_type = make()
    return Response(body, media_type=media_type, headers={"ETag": etag, "Cache-Control": CACHE_CONTROL})


def _sample(request: Request) -> tuple[StepBatch, str, int]:
    from ..query import StepQuery

    viz: Viz = request.app.state.viz
    q = StepQuery.from_params(request.query_params)
    col = request.query_params.get("col", "")
    try:
        row = int(request.query_params.get("i", ""))
    except ValueError:
        raise InvalidArgumentError("i must be a row number") from None
    sb = viz.source.read_step(q)
    if not 0 <= row < sb.num_rows:
        raise InvalidArgumentError(f"row {row} is not in the step's {sb.num_rows} rows")
    return sb, col, row


def _column(sb: StepBatch, col: str) -> np.ndarray:
    if col not in sb.arrays:
        raise InvalidArgumentError(f"no column {col!r} in the step (columns: {', '.join(sb.arrays)})")
    return sb.arrays[col]


def image(request: Request) -> Response:
    def make() -> tuple[bytes, str]:
        sb, col, row = _sample(request)
        layout = next((v.params.get("layout", "HWC") for v in views(sb) if v.column == col), "HWC")
        return encode.png(image_hwc(_column(sb, col)[row], layout)), "image/png"

    return _cached(request, make)


def frames(request: Request) -> Response:
    def make() -> tuple[bytes, str]:
        sb, col, row = _sample(request)
        count = sb.arrays.get(f"{col}_frames")
        n = int(count[row]) if count is not None else None
        return encode.png(encode.frame_strip(_column(sb, col)[row], n or None)), "image/png"

    return _cached(request, make)


def _rate(sb: StepBatch, col: str) -> int:
    return next((int(v.params["sample_rate"]) for v in views(sb) if v.column == col and v.kind == "audio"), 16000)


def audio_wav(request: Request) -> Response:
    def make() -> tuple[bytes, str]:
        sb, col, row = _sample(request)
        return encode.wav(_column(sb, col)[row], _rate(sb, col)), "audio/wav"

    return _cached(request, make)


def waveform(request: Request) -> Response:
    def make() -> tuple[bytes, str]:
        sb, col, row = _sample(request)
        return encode.waveform_svg(_column(sb, col)[row]).encode(), "image/svg+xml"

    return _cached(request, make)


def original(request: Request) -> Response:
    """The stored bytes of a sample's column, as stored (the browser decodes them, not us)."""

    def make() -> tuple[bytes, str]:
        viz: Viz = request.app.state.viz
        sb, col, row = _sample(request)
        stored = sb.arrays.get(col)
        if stored is not None and isinstance(stored[row], bytes | bytearray):
            data = stored[row]
        else:  # the column a transform replaced: the same step read without transforms
            raw = viz.source.read_original(sb.query, col)
            key = (_src(sb, row), int(sb.info.shards[row]), int(sb.info.rows[row]))
            keys = [(_src(raw, k), int(raw.info.shards[k]), int(raw.info.rows[k])) for k in range(raw.num_rows)]
            data = raw.arrays[col][keys.index(key)]
        if not isinstance(data, bytes | bytearray):
            raise InvalidArgumentError(f"column {col!r} does not hold encoded bytes")
        return bytes(data), sniff(data)[1]

    return _cached(request, make)


def _src(sb: StepBatch, row: int) -> int:
    return 0 if sb.info.sources is None else int(sb.info.sources[row])
