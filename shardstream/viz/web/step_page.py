"""The step browser (one rank's batch at one step, pane by pane), the mixture view and the shuffle plot."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from shardstream.order.delivery import make_selector, shuffle_stats
from shardstream.order.mixture import is_mixture, parse_mixture
from shardstream.order.read_order import StepLayout

from .. import encode, reproduce
from ..catalog import presets
from ..samples import ColumnView, row_summary, views
from ..source import StepBatch
from ..tokens import token_texts
from . import dense, links
from .state import Viz

__all__ = ["mixture", "stats", "step"]

MAX_TEXT_CHARS = 4000
SHORT_VALUE = 80  # values this short go on the sample's field line, not a pane of their own
SCATTER_POINTS = 1500
MIXTURE_STEPS = 10  # steps shown before and after the current one


def _query(request: Request) -> Any:
    from ..query import StepQuery

    return StepQuery.from_params(request.query_params)


def _pinned(viz: Viz, request: Request, path: str) -> tuple[Any, Response | None]:
    """The query, or a redirect to the same page with the dataset pinned (name -> name@N)."""
    q = _query(request)
    label = viz.source.target(q).label
    if label != q.dataset:
        return q, RedirectResponse(links.step_url(q.moved(dataset=label), path), status_code=307)
    if q.cursor:  # a job's step: its epoch is where the job's cursor walks to
        q = q.moved(epoch=viz.source.place(q).epoch)
    return q, None


def _media(q: Any, kind: str, col: str, row: int) -> str:
    return links.step_url(q, f"/m/{kind}", col=col, i=row)


def _tokens_pane(view: ColumnView, arrays: dict[str, np.ndarray], row: int) -> dict[str, Any]:
    ids = np.asarray(arrays[view.column][row])
    texts = token_texts(ids.tolist(), view.params.get("tokenizer"))
    spans = []
    if view.kind == "packed":
        labels = np.asarray(arrays["labels"][row])
        docs = np.asarray(arrays["document_ids"][row])
        doc_index = np.cumsum(np.r_[True, docs[1:] != docs[:-1]]) - 1
        for k, text in enumerate(texts):
            cls = [f"t{k % 2}", f"d{doc_index[k] % 2}"]
            if k and docs[k] != docs[k - 1]:
                cls.append("ds")
            if docs[k] < 0:
                cls.append("pad")
            elif labels[k] == -100:
                cls.append("nolabel")
            spans.append((text, " ".join(cls), f"id {ids[k]} label {labels[k]} doc {docs[k]}"))
        real = docs >= 0
        title = (
            f"{view.column}: {int(real.sum())} tokens of {len(ids)}, {len(set(docs[real].tolist()))} document(s), "
            f"{int((~real).sum())} padding, {int((labels == -100).sum())} without a label"
        )
    else:
        spans = [(text, f"t{k % 2}", f"id {i}") for k, (text, i) in enumerate(zip(texts, ids.tolist(), strict=True))]
        title = f"{view.column}: {len(ids)} tokens"
    return {"kind": "tokens", "title": title, "spans": spans}


def _rl_pane(view: ColumnView, arrays: dict[str, np.ndarray], row: int) -> dict[str, Any]:
    if view.kind == "rl":
        n = int(np.asarray(arrays["valid"][row]).sum())
        reward = np.asarray(arrays["reward"][row])[:n]
        returns = np.asarray(arrays["returns"][row])[:n]
        done = np.asarray(arrays["done"][row])[:n]
        actions = np.asarray(arrays["action"][row])[:n] if "action" in arrays else None
        series = [("reward", reward, "#1f6feb"), ("return", returns, "#2da44e")]
        where = f"episode {arrays['episode_id'][row]} from t={arrays['t0'][row]}" if "t0" in arrays else ""
    else:
        reward = np.asarray(arrays["reward"][row], np.float64)
        n = len(reward)
        done = np.asarray(arrays["done"][row]) if "done" in arrays else np.zeros(n)
        actions = np.asarray(arrays["action"][row]) if "action" in arrays else None
        series = [("reward", reward, "#1f6feb"), ("return", np.cumsum(reward[::-1])[::-1], "#2da44e")]
        where = "episode as stored (return = undiscounted reward-to-go)"
    marks = np.flatnonzero(np.asarray(done, bool)).tolist()
    svg = encode.line_plot(series, marks=marks, actions=actions, title=f"{n} steps {where}")
    title = f"{n} steps, reward sum {float(np.sum(reward)):.3g}, done at {marks or 'none'}"
    return {"kind": "rl", "title": title, "svg": svg, "points": n}


def _pane(view: ColumnView, step: StepBatch, row: int) -> dict[str, Any]:
    q, arrays = step.query, step.arrays
    a = arrays[view.column][row]
    col = view.column
    if view.kind == "image":
        h, w = (a.shape[1], a.shape[2]) if view.params["layout"] == "CHW" else a.shape[:2]
        src_col = _source_column(q, col)
        return {
            "kind": "image",
            "title": f"{col}: {' x '.join(map(str, a.shape))} {a.dtype}",
            "src": _media(q, "image", col, row),
            "original": _media(q, "original", src_col, row) if src_col else None,
            "width": w,
            "height": h,
        }
    if view.kind == "video":
        real = int(arrays[view.companions[0]][row]) if view.companions else len(a)
        src_col = _source_column(q, col)
        return {
            "kind": "video",
            "title": f"{col}: {len(a)} frames ({real} real) of {a.shape[1]} x {a.shape[2]}",
            "src": _media(q, "frames", col, row),
            "original": _media(q, "original", src_col, row) if src_col else None,
        }
    if view.kind == "audio":
        real = int(arrays[view.companions[0]][row]) if view.companions else len(a)
        rate = view.params["sample_rate"]
        return {
            "kind": "audio",
            "title": f"{col}: {len(a)} samples ({real} real) at {rate} Hz = {len(a) / rate:.3f} s",
            "src": _media(q, "wav", col, row),
            "waveform": _media(q, "waveform", col, row),
            "duration": len(a) / rate,
        }
    if view.kind in ("packed", "tokens"):
        return _tokens_pane(view, arrays, row)
    if view.kind in ("rl", "episode"):
        return _rl_pane(view, arrays, row)
    if view.kind == "media":
        from ..samples import sniff

        kind, mime = sniff(a)
        return {"kind": f"stored-{kind}", "title": f"{col}: {mime}, {len(a):,} bytes", "src": _media(q, "original", col, row)}
    if view.kind == "text":
        text = str(a)
        if len(text) <= SHORT_VALUE and "\n" not in text:
            return {"kind": "field", "title": col, "text": text}
        more = f" (first {MAX_TEXT_CHARS:,} of {len(text):,} characters)" if len(text) > MAX_TEXT_CHARS else ""
        return {"kind": "text", "title": f"{col}{more}", "text": text[:MAX_TEXT_CHARS]}
    value = a.tolist() if hasattr(a, "tolist") else a
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    kind = "field" if len(text) <= SHORT_VALUE else "value"
    return {"kind": kind, "title": col, "text": text[:400] + ("…" if len(text) > 400 else "")}


def _source_column(q: Any, col: str) -> str | None:
    """The stored column a transform made `col` from (its original), if any."""
    for t in q.transform_list:
        if t.get("output", t.get("column")) == col and t.get("column"):
            return str(t["column"])
    return None


def _label(sb: StepBatch, source: int) -> str:
    src = sb.target.sources[source]
    return f"{src.name}@{src.version}"


def step(request: Request) -> Response:
    viz: Viz = request.app.state.viz
    q, redirect = _pinned(viz, request, "/step")
    if redirect is not None:
        return redirect
    sb = viz.source.read_step(q)
    info, catalog = sb.info, viz.catalog
    column_views = views(sb)
    cards = []
    for row in range(sb.num_rows):
        label = sb.source_label(row)
        panes = [{**_pane(v, sb, row), "column": v.column} for v in column_views]
        cards.append(
            {
                "row": row,
                "src": None if info.sources is None else int(info.sources[row]) % 6,
                "summary": row_summary(sb, row),
                "source": label,
                "shard": catalog.shard_name(label, int(info.shards[row])),
                "shard_row": int(info.rows[row]),
                "position": sb.position(row),
                "documents": [
                    f"{catalog.shard_name(sb.source_label(row) if d.source is None else _label(sb, d.source), d.shard)} "
                    f"row {d.row} tokens [{d.start}, {d.end})"
                    for d in (info.documents[row] if info.documents is not None else ())
                ],
                "panes": [p for p in panes if p["kind"] != "field"],
                "fields": [(p["title"], p["text"]) for p in panes if p["kind"] == "field"],
            }
        )
    layout = dense.layout_of(cards)
    columns = dense.table_columns(cards) if layout == "table" else []
    for c in cards:
        if layout == "table":
            values = {k: {"kind": "field", "text": v} for k, v in c["fields"]} | {p["column"]: p for p in c["panes"]}
            c["cells"] = [values.get(k) for k in columns]
        elif layout == "grid":
            c["caption"] = " · ".join(v for _, v in c["fields"])[:60]
    last = sb.steps_in_epoch - 1
    anchor = q.job_cursor
    first = 0 if anchor is None else anchor[0]  # a job's step: from its cursor's on
    nav = {
        "first": links.step_url(q.moved(step=first)),
        "prev": links.step_url(q.moved(step=q.step - 1)) if q.step > first else None,
        "next": links.step_url(q.moved(step=q.step + 1)) if q.step < last else None,
        "last": links.step_url(q.moved(step=last)),
        "rank_up": links.step_url(q.moved(rank=q.rank - 1)) if q.rank > 0 else None,
        "rank_down": links.step_url(q.moved(rank=q.rank + 1)) if q.rank + 1 < q.world_size else None,
        "epoch_prev": links.step_url(q.moved(epoch=q.epoch - 1)) if q.epoch > 0 and anchor is None else None,
        "epoch_next": links.step_url(q.moved(epoch=q.epoch + 1)) if anchor is None else None,
        "ranks": [(r, links.step_url(q.moved(rank=r))) for r in range(min(q.world_size, 16))],
    }
    looks = []
    if not is_mixture(q.dataset):
        looks = [(label, links.step_url(q.moved(transforms=tf))) for label, tf in presets(catalog.version(q.dataset))]
    return viz.page(
        request,
        "step.html",
        title=f"{q.dataset} step {q.step} rank {q.rank}",
        q=q,
        sb=sb,
        info=info,
        cards=cards,
        layout=layout,
        columns=columns,
        counts=dense.counts(sb),
        nav=nav,
        looks=looks,
        skipped=info.skipped,
        shares=_shares(viz, q, info),
        reproduce=reproduce.script(
            q,
            viz.source.endpoints,
            viz.source.loader_state(q),
            tls=viz.source.tls,
            token=bool(viz.source.security.metadata),
        ),
        mixture=links.mixture_url(q) if sb.target.mixture is not None and anchor is None else None,
        stats=links.stats_url(q) if catalog.registry is not None else None,
    )


def _shares(viz: Viz, q: Any, info: Any) -> list[dict[str, Any]] | None:
    """Under balance=, each rank's share of the step (rows, tokens with a label, cost and cost over the
    step's mean), read as each rank receives it (the first 16 ranks); None without balance."""
    if not q.balance:
        return None
    out = []
    for r in range(min(q.world_size, 16)):
        i = info if r == q.rank else viz.source.read_step(q.moved(rank=r)).info
        mean = i.step_cost / q.world_size if i.step_cost else 0.0
        out.append(
            {
                "rank": r,
                "url": links.step_url(q.moved(rank=r)),
                "rows": len(i.rows),
                "tokens": i.tokens,
                "cost": i.cost,
                "over_mean": i.cost / mean if mean else 1.0,
            }
        )
    return out


def mixture(request: Request) -> Response:
    viz: Viz = request.app.state.viz
    q, redirect = _pinned(viz, request, "/mixture")
    if redirect is not None:
        return redirect
    target = viz.source.target(q)
    plan = target.mixture
    if plan is None:
        return viz.page(request, "error.html", status_code=400, message=f"{q.dataset} is not a mixture")
    layout = StepLayout(target.num_rows, 0, q.world_size, q.batch_size, q.drop_last)
    lo, hi = max(0, q.step - MIXTURE_STEPS), min(layout.num_steps, q.step + MIXTURE_STEPS + 1)
    names = [s.ref for s in plan.sources]
    rows = []
    for t in range(lo, hi):
        start, end = layout.global_range(t)
        src = plan.locate(q.epoch, np.arange(start, end, dtype=np.int64))[0]
        counts = np.bincount(src, minlength=len(names))
        rows.append(
            {
                "step": t,
                "url": links.step_url(q.moved(step=t)),
                "current": t == q.step,
                "shares": [(names[k], int(c), 100.0 * c / max(1, end - start)) for k, c in enumerate(counts)],
            }
        )
    weights = [(s.ref, s.weight / sum(x.weight for x in plan.sources)) for s in plan.sources]
    return viz.page(
        request, "mixture.html", title=f"mixture {target.label}", q=q, rows=rows, weights=weights, names=names,
        back=links.step_url(q),
    )


def stats(request: Request) -> Response:
    viz: Viz = request.app.state.viz
    q, redirect = _pinned(viz, request, "/stats")
    if redirect is not None:
        return redirect
    manifests = viz.catalog.manifests(q.dataset)
    if manifests is None:
        return viz.page(
            request, "error.html", status_code=400,
            message="the shuffle-quality plot reads the manifests: start `shardstream web` with --root",
        )
    weights = [w for _, w in parse_mixture(q.dataset)] if is_mixture(q.dataset) else None
    sel = make_selector(manifests, weights, seed=q.seed, shuffle=q.shuffle_spec)
    layout = StepLayout(sel.num_rows, 0, q.world_size, q.batch_size, q.drop_last)
    figures = shuffle_stats(sel, layout, q.epoch)
    positions = np.unique(np.linspace(0, sel.num_rows - 1, num=min(sel.num_rows, SCATTER_POINTS)).astype(np.int64))
    rows = sel.order.select(q.epoch, positions)[1]
    svg = encode.scatter_plot(positions, rows, title=f"{sel.label}: row read at each position, shuffle {q.shuffle_spec}")
    modes = [(m, links.stats_url(q.moved(shuffle=m))) for m in ("none", "block", "full")]
    return viz.page(
        request, "stats.html", title=f"shuffle quality {sel.label}", q=q, figures=figures, svg=svg, modes=modes,
        back=links.step_url(q),
    )
