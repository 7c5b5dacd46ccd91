"""Received arrays -> PNG, WAV and SVG for display. Encoding only: nothing here decodes stored data.

PNG is written with zlib at level 1 (a 224² RGB image in about a millisecond); WAV is 16-bit PCM of
the received float samples; plots are SVG built by hand, so the web extra needs no plotting library
and a test can count a plot's points in the page.
"""

from __future__ import annotations

import io
import struct
import wave
import zlib
from collections.abc import Sequence
from html import escape

import numpy as np

__all__ = ["frame_strip", "line_plot", "png", "scatter_plot", "sparkline", "wav", "waveform_svg"]


def png(pixels: np.ndarray) -> bytes:
    """uint8 [H, W, 3] (or [H, W]) -> PNG bytes."""
    a = np.ascontiguousarray(pixels, dtype=np.uint8)
    if a.ndim == 2:
        a = a[..., None]
    h, w, c = a.shape
    color = {1: 0, 3: 2, 4: 6}[c]
    raw = np.concatenate([np.zeros((h, 1), np.uint8), a.reshape(h, w * c)], axis=1).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b"")


def frame_strip(frames: np.ndarray, count: int | None = None, gap: int = 2) -> np.ndarray:
    """Video frames [F, H, W, 3] side by side (the first `count`), `gap` black pixels apart."""
    f = np.asarray(frames)[: count or len(frames)]
    n, h, w, c = f.shape
    out = np.zeros((h, n * w + (n - 1) * gap, c), np.uint8)
    for i in range(n):
        out[:, i * (w + gap) : i * (w + gap) + w] = f[i]
    return out


def wav(samples: np.ndarray, sample_rate: int) -> bytes:
    """float samples in [-1, 1] -> 16-bit PCM mono WAV."""
    pcm = (np.clip(np.asarray(samples, np.float64), -1, 1) * 32767).round().astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float] | np.ndarray, width: int = 48) -> str:
    """Unicode block sparkline of `values` (max |value| per bucket for long series)."""
    v = np.asarray(values, np.float64)
    if not len(v):
        return ""
    if len(v) > width:
        v = np.array([b.max() if len(b) else 0 for b in np.array_split(v, width)])
    lo, hi = float(v.min()), float(v.max())
    scale = (hi - lo) or 1.0
    return "".join(BLOCKS[int((x - lo) / scale * (len(BLOCKS) - 1))] for x in v)


def waveform_svg(samples: np.ndarray, width: int = 600, height: int = 80) -> str:
    """A min/max envelope of the samples, one column per pixel."""
    s = np.asarray(samples, np.float64)
    cols = np.array_split(s, min(width, max(1, len(s)))) if len(s) else []
    mid = height / 2
    bars = []
    for x, c in enumerate(cols):
        lo, hi = (float(c.min()), float(c.max())) if len(c) else (0.0, 0.0)
        y1, y2 = mid - hi * mid, mid - lo * mid
        bars.append(f'<line x1="{x}" x2="{x}" y1="{y1:.1f}" y2="{max(y2, y1 + 0.5):.1f}"/>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{len(cols)}" height="{height}" '
        f'viewBox="0 0 {max(1, len(cols))} {height}"><rect width="100%" height="100%" fill="#fff"/>'
        f'<g stroke="#1f6feb" stroke-width="1">{"".join(bars)}</g></svg>'
    )


def line_plot(
    series: Sequence[tuple[str, np.ndarray, str]],
    *,
    marks: Sequence[int] = (),
    actions: np.ndarray | None = None,
    width: int = 600,
    height: int = 180,
    title: str = "",
) -> str:
    """Lines with a point per step (class = the series' name), vertical marks (done) and, below, an
    action timeline (one coloured cell per step)."""
    n = max((len(v) for _, v, _ in series), default=0)
    pad, strip = 30, 14 if actions is not None else 0
    plot_h = height - pad - strip - 8
    values = np.concatenate([np.asarray(v, np.float64) for _, v, _ in series if len(v)] or [np.zeros(1)])
    lo, hi = float(values.min()), float(values.max())
    span = (hi - lo) or 1.0

    def x(i: int) -> float:
        return pad + (i + 0.5) * (width - pad - 8) / max(1, n)

    def y(v: float) -> float:
        return 8 + (hi - v) / span * plot_h

    parts = [f'<rect width="{width}" height="{height}" fill="#fff"/>']
    if title:
        parts.append(f'<text x="{pad}" y="12" font-size="11">{escape(title)}</text>')
    if lo < 0 < hi:
        parts.append(f'<line x1="{pad}" x2="{width - 8}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#ccc"/>')
    for i in marks:
        parts.append(
            f'<line class="done" x1="{x(i):.1f}" x2="{x(i):.1f}" y1="8" y2="{8 + plot_h}" stroke="#d00" stroke-dasharray="3 2"/>'
        )
    for name, v, colour in series:
        pts = [(x(i), y(float(val))) for i, val in enumerate(np.asarray(v, np.float64))]
        path = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
        parts.append(f'<polyline class="{escape(name)}" points="{path}" fill="none" stroke="{colour}"/>')
        parts += [f'<circle class="{escape(name)}" cx="{a:.1f}" cy="{b:.1f}" r="2" fill="{colour}"/>' for a, b in pts]
    if actions is not None and len(actions):
        a = np.asarray(actions).reshape(len(actions), -1)[:, 0]
        palette = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"]
        cell = (width - pad - 8) / max(1, n)
        top = height - strip - 2
        for i, act in enumerate(a.tolist()):
            colour = palette[int(act) % len(palette)] if float(act).is_integer() else "#888"
            parts.append(
                f'<rect class="action" x="{pad + i * cell:.1f}" y="{top}" width="{max(cell - 0.5, 0.5):.1f}" '
                f'height="{strip}" fill="{colour}"><title>t={i} action {act}</title></rect>'
            )
    parts.append(f'<text x="2" y="{y(hi) + 4:.0f}" font-size="9">{hi:.2g}</text>')
    parts.append(f'<text x="2" y="{y(lo):.0f}" font-size="9">{lo:.2g}</text>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">{"".join(parts)}</svg>'
    )


def scatter_plot(xs: np.ndarray, ys: np.ndarray, *, width: int = 420, height: int = 420, title: str = "") -> str:
    """Points (x, y), each axis scaled to its range: the shuffle-quality plot (position vs row)."""
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    pad = 30

    def scale(v: np.ndarray, size: float) -> np.ndarray:
        lo, hi = (float(v.min()), float(v.max())) if len(v) else (0.0, 1.0)
        return (v - lo) / ((hi - lo) or 1.0) * size

    px = pad + scale(xs, width - pad - 8)
    py = height - pad - scale(ys, height - pad - 8)
    dots = "".join(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="1.2"/>' for a, b in zip(px, py, strict=True))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<rect width="100%" height="100%" fill="#fff"/><text x="{pad}" y="12" font-size="11">{escape(title)}</text>'
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - 8}" y2="{height - pad}" stroke="#888"/>'
        f'<line x1="{pad}" y1="8" x2="{pad}" y2="{height - pad}" stroke="#888"/>'
        f'<text x="{width / 2:.0f}" y="{height - 8}" font-size="10">position in the epoch</text>'
        f'<text x="4" y="{height / 2:.0f}" font-size="10" transform="rotate(-90 10 {height / 2:.0f})">row</text>'
        f'<g fill="#1f6feb">{dots}</g></svg>'
    )
