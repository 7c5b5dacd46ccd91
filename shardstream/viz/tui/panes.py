"""Terminal renderings of one received row, by modality (Rich renderables, no decoding).

Images and video frames are drawn with half blocks: each character cell shows two pixels, the upper
one as the foreground of '▀' and the lower one as its background, sampled (nearest) from the
received pixels down to the pane's width. Audio is a sparkline of the envelope; tokens alternate
colours, with packed-document boundaries and the label mask marked; RL rows are a table of steps
with reward/return sparklines and done markers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..encode import sparkline
from ..samples import ColumnView, image_hwc, sniff
from ..source import StepBatch
from ..tokens import token_texts

__all__ = ["half_blocks", "render_row"]

IMAGE_COLUMNS = 32  # character cells across an image
FRAME_COLUMNS = 12  # ... across each video frame
MAX_TOKENS = 768
MAX_RL_ROWS = 24
TOKEN_STYLES = ("on #1c3b5a", "on #4a3b12")


def half_blocks(pixels: np.ndarray, columns: int) -> list[Text]:
    """uint8 [H, W, 3] -> lines of '▀' cells, `columns` wide (fewer for narrow images)."""
    h, w = pixels.shape[:2]
    cols = max(1, min(columns, w))
    rows = max(2, int(round(h * cols / w)) // 2 * 2)
    ys = np.minimum((np.arange(rows) + 0.5) * h / rows, h - 1).astype(int)
    xs = np.minimum((np.arange(cols) + 0.5) * w / cols, w - 1).astype(int)
    small = pixels[ys][:, xs]
    lines = []
    for y in range(0, rows, 2):
        line = Text()
        for x in range(cols):
            top, bottom = small[y, x], small[y + 1, x]
            line.append("▀", style=f"rgb({top[0]},{top[1]},{top[2]}) on rgb({bottom[0]},{bottom[1]},{bottom[2]})")
        lines.append(line)
    return lines


def _side_by_side(blocks: list[list[Text]], gap: str = " ") -> list[Text]:
    height = max(len(b) for b in blocks)
    out = []
    for y in range(height):
        line = Text()
        for k, b in enumerate(blocks):
            if k:
                line.append(gap)
            line.append_text(b[y] if y < len(b) else Text(" " * len(b[0].plain)))
        out.append(line)
    return out


def _tokens(view: ColumnView, arrays: dict[str, np.ndarray], row: int) -> RenderableType:
    ids = np.asarray(arrays[view.column][row])
    shown = ids[:MAX_TOKENS]
    texts = token_texts(shown.tolist(), view.params.get("tokenizer"))
    out = Text()
    if view.kind == "packed":
        labels = np.asarray(arrays["labels"][row])
        docs = np.asarray(arrays["document_ids"][row])
        real = docs >= 0
        head = (
            f"{view.column}: {int(real.sum())} tokens of {len(ids)}, {len(set(docs[real].tolist()))} document(s), "
            f"{int((~real).sum())} padding, {int((labels == -100).sum())} without a label (struck through)\n"
        )
        out.append(head, style="bold")
        for k, t in enumerate(texts):
            if k and docs[k] != docs[k - 1]:
                out.append("│", style="bold red")
            style = TOKEN_STYLES[k % 2]
            if docs[k] < 0:
                style = "dim"
            elif labels[k] == -100:
                style += " strike dim"
            out.append(t, style=style)
    else:
        out.append(f"{view.column}: {len(ids)} tokens\n", style="bold")
        for k, t in enumerate(texts):
            out.append(t, style=TOKEN_STYLES[k % 2])
    if len(ids) > MAX_TOKENS:
        out.append(f" … {len(ids) - MAX_TOKENS} more", style="italic")
    return out


def _rl(view: ColumnView, arrays: dict[str, np.ndarray], row: int) -> RenderableType:
    if view.kind == "rl":
        n = int(np.asarray(arrays["valid"][row]).sum())
        returns = np.asarray(arrays["returns"][row])[:n]
        where = f" of episode {arrays['episode_id'][row]} from t={arrays['t0'][row]}" if "t0" in arrays else ""
    else:
        n = len(arrays["reward"][row])
        returns = np.cumsum(np.asarray(arrays["reward"][row], np.float64)[::-1])[::-1]
        where = " (episode as stored; return = reward-to-go)"
    reward = np.asarray(arrays["reward"][row])[:n]
    done = np.asarray(arrays["done"][row])[:n].astype(bool) if "done" in arrays else np.zeros(n, bool)
    action = np.asarray(arrays["action"][row])[:n] if "action" in arrays else None
    head = Text(f"{n} steps{where}, reward sum {float(reward.sum()):.3g}\n", style="bold")
    head.append(f"reward  {sparkline(reward, 60)}\nreturn  {sparkline(returns, 60)}\n")
    head.append("done    " + "".join("D" if d else "·" for d in done[:60]) + "\n")
    table = Table("t", "action", "reward", "return", "done", box=None, pad_edge=False)
    for t in range(min(n, MAX_RL_ROWS)):
        act = "" if action is None else str(np.asarray(action[t]).tolist())
        table.add_row(str(t), act, f"{float(reward[t]):.3f}", f"{float(returns[t]):.3f}", "D" if done[t] else "")
    if n > MAX_RL_ROWS:
        table.add_row("…", "", "", "", "")
    return Group(head, table)


def _view(view: ColumnView, sb: StepBatch, row: int) -> RenderableType:
    arrays = sb.arrays
    a = arrays[view.column][row]
    col = view.column
    if view.kind == "image":
        pixels = image_hwc(a, view.params["layout"])
        title = Text(f"{col}: {' x '.join(map(str, np.shape(a)))} {a.dtype}", style="bold")
        return Group(title, *half_blocks(pixels, IMAGE_COLUMNS))
    if view.kind == "video":
        real = int(arrays[view.companions[0]][row]) if view.companions else len(a)
        frames = [half_blocks(np.asarray(f), FRAME_COLUMNS) for f in np.asarray(a)[: max(1, real)]]
        title = Text(f"{col}: {len(a)} frames ({real} real) of {a.shape[1]} x {a.shape[2]}", style="bold")
        return Group(title, *_side_by_side(frames))
    if view.kind == "audio":
        real = int(arrays[view.companions[0]][row]) if view.companions else len(a)
        rate = view.params["sample_rate"]
        env = np.abs(np.asarray(a, np.float64))
        return Text(
            f"{col}: {len(a)} samples ({real} real) at {rate} Hz = {len(a) / rate:.3f} s\n{sparkline(env, 72)}"
        )
    if view.kind in ("packed", "tokens"):
        return _tokens(view, arrays, row)
    if view.kind in ("rl", "episode"):
        return _rl(view, arrays, row)
    if view.kind == "media":
        kind, mime = sniff(a)
        return Text(f"{col}: {mime}, {len(a):,} bytes as stored (press t to add a decode transform)")
    if view.kind == "text":
        text = str(a)
        return Text(f"{col}: {text[:600]}{'…' if len(text) > 600 else ''}")
    value: Any = a.tolist() if hasattr(a, "tolist") else a
    text = repr(value)
    return Text(f"{col}: {text[:200]}{'…' if len(text) > 200 else ''}")


def render_row(sb: StepBatch, views: list[ColumnView], row: int, shard: str) -> RenderableType:
    """Provenance, then every view of the row."""
    pos = sb.position(row)
    prov = Text(
        f"#{row}  {sb.source_label(row)}  {shard} row {int(sb.info.rows[row])}"
        f"{f'  position {pos}' if pos is not None else ''}",
        style="bold cyan",
    )
    return Group(prov, *(_view(v, sb, row) for v in views))
