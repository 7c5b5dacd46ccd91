"""`shardstream web` in headless Chromium: every page loads cleanly, media are real, URLs carry state.

The app runs as `shardstream web --root R` (which starts its own server over R) on a free port; a
separate server over the same root feeds the Loader the pages are compared with. The browser is
Debian's Chromium driven by playwright (`executable_path`, never `playwright install`).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np
import pytest

from shardstream.client import Loader
from shardstream.viz.query import StepQuery, step_of

from .support.servers import Servers, unused_port, wait_for
from .support.viz_data import MIXTURE, make_viz_registry

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DECODE = json.dumps([{"op": "image.decode", "column": "image", "size": [64, 48]}])
AUDIO = json.dumps([{"op": "audio.decode", "column": "audio", "sample_rate": 8000, "seconds": 0.75}])
VIDEO = json.dumps([{"op": "video.frames", "column": "video", "num_frames": 4, "stride": 2, "size": [32, 32]}])
RL = json.dumps([{"op": "rl.windows", "window": 16, "stride": 8, "n_step": 3, "gamma": 0.99}])
PACK = json.dumps([{"op": "text.tokenize", "column": "text"}, {"op": "text.pack", "column": "text", "seq_len": 64}])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_viz_registry(tmp_path_factory.mktemp("web") / "root")


@pytest.fixture(scope="module")
def store(root: Path) -> str:
    """A cursor store holding job `train-1`: two ranks committed step 3 of photos@1 (world 2, batch 2)."""
    from shardstream.client.cursors.records import CursorRecord
    from shardstream.client.cursors.stores import open_store
    from shardstream.client.loader_state import LoaderState
    from shardstream.registry import Registry

    fingerprint = Registry(root).resolve("photos@1").fingerprint
    url = f"sqlite:///{root.parent / 'cursors.db'}"
    st = open_store(url)
    try:
        for rank in range(2):
            rec = CursorRecord("train-1", rank, 3, LoaderState("photos@1", fingerprint, 0, "block(window=16)", 0, 12, 2, 2, 3))
            st.write("train-1", 3, rec.key, rank, 2, rec.to_bytes())
    finally:
        st.close()
    return url


@pytest.fixture(scope="module")
def web(root: Path, store: str) -> Iterator[str]:
    yield from serve_web(root, "--root", str(root), "--store", store)


def serve_web(root: Path, *args: str) -> Iterator[str]:
    """`shardstream web ARGS` on a free port: its base URL while it runs; checks it left nothing over `root`."""
    port = unused_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardstream", "web", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "exited"
        try:
            with urllib.request.urlopen(base + "/", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        wait_for(up, "shardstream web to answer")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
    # SIGTERM stopped the server the app started over --root too
    import psutil

    left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(root) in " ".join(p.info["cmdline"] or ())]
    assert not left, f"shardstream web left processes behind: {left}"


@pytest.fixture(scope="module")
def endpoint(root: Path) -> Iterator[str]:
    with Servers(root) as servers:
        yield servers.start().target


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is not installed (apt-get install chromium chromium-driver; .ci/run does this)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Page:
    """A browser page that records console errors and failed responses."""

    def __init__(self, browser: Any, base: str) -> None:
        self.base = base
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("response", lambda r: self.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)

    def open(self, path: str) -> Any:
        resp = self.page.goto(self.base + path, wait_until="networkidle")
        assert resp is not None and resp.status == 200, (path, resp and resp.status)
        assert not self.errors, (path, self.errors)
        return self.page


@pytest.fixture
def page(browser: Any, web: str) -> Iterator[Page]:
    p = Page(browser, web)
    yield p
    p.page.close()


def step_path(dataset: str, **kw: Any) -> str:
    return "/step?" + urlencode(StepQuery(dataset, **kw).to_params())


def loader_batch(endpoint: str, q: StepQuery) -> dict[str, Any]:
    with Loader([endpoint], q.dataset, **q.loader_kwargs(), prefetch=2) as loader:
        for i, batch in enumerate(loader):
            if i == q.step:
                return batch
    raise AssertionError(f"no step {q.step}")


def summaries(pg: Any) -> list[dict[str, Any]]:
    return [json.loads(s) for s in pg.eval_on_selector_all(".card", "cs => cs.map(c => c.dataset.summary)")]


# --- every page -----------------------------------------------------------------------------------
def test_every_page_loads_without_console_errors(page: Page) -> None:
    pages = [
        "/",
        "/d/notes",
        "/v/notes@2",
        "/diff?a=notes@1&b=notes@2",
        "/jobs",
        "/jobs/train-1",
        "/fleet",
        "/stats?d=photos@1",
        "/mixture?" + urlencode({"d": MIXTURE, "ws": 2, "bs": 4, "step": 3}),
        step_path(MIXTURE, world_size=2, batch_size=4, step=3),
        step_path("clips@1", batch_size=3, transforms=VIDEO),
        step_path("sounds@1", batch_size=3, transforms=AUDIO),
        step_path("episodes@1", batch_size=3),
        step_path("text@1", batch_size=2, transforms=PACK),
    ]
    for path in pages:
        pg = page.open(path)
        assert pg.inner_text("h1")
    # and every link of the datasets and a version page
    pg = page.open("/")
    hrefs = pg.eval_on_selector_all("#datasets a", "as => as.map(a => a.getAttribute('href'))")
    assert len(hrefs) == 2 * 6
    for href in hrefs:
        page.open(href)
    pg = page.open("/v/photos@1")
    looks = pg.eval_on_selector_all("#looks a", "as => as.map(a => a.getAttribute('href'))")
    assert len(looks) == 3
    for href in looks:
        page.open(href)


def test_the_pages_say_what_they_show(page: Page) -> None:
    pg = page.open("/d/notes")
    assert pg.inner_text("#versions").count("notes@") == 2
    pg = page.open("/diff?a=notes@1&b=notes@2")
    assert "48 → 56" in pg.inner_text("#diff") and "append" in pg.inner_text("#diff")
    pg = page.open("/jobs/train-1")
    links = pg.eval_on_selector_all("#job a", "as => as.map(a => a.getAttribute('href'))")
    assert len(links) == 2 and all("step=3" in h for h in links)  # offset 12 = step 3 of 2 x 2
    pg = page.open("/fleet")
    assert "SERVING" in pg.inner_text("#fleet")
    pg = page.open("/mixture?" + urlencode({"d": MIXTURE, "ws": 2, "bs": 5, "step": 2}))
    row = pg.inner_text("#mixture tr.current")
    assert "text@1" not in row and row.split("\t")[0].strip() == "2"
    pg = page.open("/stats?d=photos@1&shuffle=none")
    assert "mean_displacement" in pg.inner_text("#stats")
    assert pg.eval_on_selector_all("#scatter circle", "cs => cs.length") > 10


# --- media ----------------------------------------------------------------------------------------
def variance(png: bytes) -> float:
    from PIL import Image

    return float(np.asarray(Image.open(io.BytesIO(png)).convert("L"), np.float64).var())


def zoomed(pg: Any, thumb: Any) -> list[Any]:
    """Click a grid thumbnail: its zoom (the :target) shows the received image beside the stored one."""
    if pg.query_selector(":target .close"):
        pg.click(":target .close")  # the open zoom covers the grid
    thumb.click()
    zoom = pg.query_selector(":target")
    assert zoom is not None and zoom.is_visible()
    pg.wait_for_function("() => [...document.querySelectorAll(':target img')].every(i => i.complete)")
    return zoom.query_selector_all("img")


def test_images_are_decoded_real_and_not_blank(page: Page) -> None:
    pg = page.open(step_path("photos@1", batch_size=6, step=1, transforms=DECODE))
    decoded = pg.query_selector_all("#samples img.decoded")
    assert len(decoded) == 6
    for img in decoded:
        assert img.evaluate("i => i.complete && i.naturalWidth > 0")
        assert variance(img.screenshot()) > 5.0
    assert all(img.evaluate("i => [i.naturalWidth, i.naturalHeight]") == [48, 64] for img in decoded)
    for thumb in decoded:
        big = zoomed(pg, thumb)
        assert [i.get_attribute("class") for i in big] == ["decoded", "original"]
        for img in big:
            assert img.evaluate("i => i.complete && i.naturalWidth > 0") and variance(img.screenshot()) > 5.0


def test_audio_players_report_the_received_duration(page: Page, endpoint: str) -> None:
    q = StepQuery("sounds@1", batch_size=4, step=1, transforms=AUDIO)
    pg = page.open(step_path(q.dataset, batch_size=4, step=1, transforms=AUDIO))
    pg.wait_for_function("() => [...document.querySelectorAll('audio')].every(a => a.readyState >= 1)")
    durations = pg.eval_on_selector_all("audio", "as => as.map(a => a.duration)")
    batch = loader_batch(endpoint, q)
    assert durations == pytest.approx([batch["audio"].shape[1] / 8000] * 4, abs=1e-3)
    for img in pg.query_selector_all("img.waveform"):
        assert img.evaluate("i => i.naturalWidth > 0")


def test_the_rl_plot_has_a_point_per_step(page: Page, endpoint: str) -> None:
    q = StepQuery("episodes@1", batch_size=3, step=2, transforms=RL)
    pg = page.open(step_path(q.dataset, batch_size=3, step=2, transforms=RL))
    points = pg.eval_on_selector_all(".rl", "ds => ds.map(d => d.querySelectorAll('circle.reward').length)")
    batch = loader_batch(endpoint, q)
    assert points == batch["valid"].sum(axis=1).tolist()
    # episodes as stored: one point per time step of the episode
    q = StepQuery("episodes@1", batch_size=3, step=2)
    pg = page.open(step_path(q.dataset, batch_size=3, step=2, transforms=""))
    points = pg.eval_on_selector_all(".rl", "ds => ds.map(d => d.querySelectorAll('circle.reward').length)")
    assert points == loader_batch(endpoint, q)["length"].tolist()


def test_video_frame_strips_are_images(page: Page) -> None:
    pg = page.open(step_path("clips@1", batch_size=3, transforms=VIDEO))
    strips = pg.query_selector_all("img.strip")
    assert len(strips) == 3
    for img in strips:
        assert img.evaluate("i => i.naturalWidth > 0") and variance(img.screenshot()) > 5.0


# --- state in the URL ---------------------------------------------------------------------------
@pytest.mark.parametrize(("dataset", "transforms"), [("photos@1", DECODE), ("text@1", PACK), ("text@1", "")])
def test_the_url_of_rank_3_step_7_shows_what_a_loader_received_there(
    page: Page, endpoint: str, dataset: str, transforms: str
) -> None:
    q = StepQuery(dataset, world_size=4, batch_size=1, rank=3, step=7, seed=11, transforms=transforms)
    pg = page.open("/step?" + urlencode(q.to_params()))
    batch = loader_batch(endpoint, q)
    got = summaries(pg)
    with Loader([endpoint], q.dataset, **q.loader_kwargs()) as loader:
        steps = len(loader)  # the epoch's steps
    assert pg.inner_text("#step-of") == step_of(7, steps) == f"step 7 of {steps} (0..{steps - 1})"  # as view says
    if "input_ids" in batch:
        assert [s["tokens"] for s in got] == (batch["document_ids"] >= 0).sum(axis=1).tolist()
        # every document of each packed row, with its shard and row (text.pack "documents")
        listed = pg.eval_on_selector_all(".card .documents", "ds => ds.map(d => d.textContent)")
        assert [int(t.split(" ")[0]) for t in listed] == [len(set(r[r >= 0].tolist())) for r in batch["document_ids"]]
        assert all(t.count(" row ") == int(t.split(" ")[0]) for t in listed)
    else:
        assert [s["id"] for s in got] == batch["id"].tolist()
    # the navigation links carry the state: the next step of the same rank, job and transforms
    pg.click("#next")
    pg.wait_for_load_state("networkidle")
    assert "step=8" in pg.url and "rank=3" in pg.url and "seed=11" in pg.url
    if "id" in batch:
        assert [s["id"] for s in summaries(pg)] == loader_batch(endpoint, q.moved(step=8))["id"].tolist()


def test_an_unpinned_name_redirects_to_its_version(page: Page) -> None:
    pg = page.open("/step?d=notes&bs=4")
    assert "d=notes%402" in pg.url


def test_media_are_cacheable_and_revalidate_without_a_read(web: str) -> None:
    q = StepQuery("photos@1", batch_size=2, transforms=DECODE)
    url = web + "/m/image?" + urlencode({**q.to_params(), "col": "image", "i": 1})
    with urllib.request.urlopen(url, timeout=30) as first:
        etag = first.headers["ETag"]
        assert "immutable" in first.headers["Cache-Control"] and first.read()[:4] == b"\x89PNG"
    req = urllib.request.Request(url, headers={"If-None-Match": etag})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=30)
    exc.value.close()
    assert exc.value.code == 304


def test_a_bad_query_is_a_page_that_says_why(web: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(web + "/step?d=photos@1&rank=4&ws=2", timeout=30)
    body = exc.value.read()
    exc.value.close()
    assert exc.value.code == 400 and b"rank must be in [0, 2)" in body


# --- "Copy as Python" -----------------------------------------------------------------------------
RUN_AND_DUMP = "\nimport pickle, sys\nwith open(sys.argv[1], 'wb') as f:\n    pickle.dump(batch, f)\n"


@pytest.mark.parametrize(
    "q",
    [
        StepQuery("photos@1", world_size=4, batch_size=2, rank=3, step=5, epoch=1, seed=11, transforms=DECODE),
        StepQuery("text@1", world_size=2, batch_size=2, rank=1, step=2, shuffle="full", transforms=PACK),
        StepQuery(MIXTURE, world_size=2, batch_size=4, rank=1, step=3, columns="name", shuffle="none", drop_last=True),
    ],
    ids=["images-epoch-1", "packed-text", "mixture-columns"],
)
def test_copy_as_python_is_a_script_whose_batch_is_the_batch_shown(page: Page, web: str, tmp_path: Path, q: StepQuery) -> None:
    pg = page.open("/step?" + urlencode(q.to_params()))
    shown = summaries(pg)
    script = pg.text_content("#reproduce")
    assert script and "null" not in script and "from shardstream.client import Loader" in script
    path = tmp_path / "reproduce.py"
    path.write_text(script + RUN_AND_DUMP)
    out = tmp_path / "batch.pickle"
    proc = subprocess.run(
        [sys.executable, str(path), str(out)], capture_output=True, text=True, timeout=120, start_new_session=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    import pickle

    batch = pickle.loads(out.read_bytes())
    if "input_ids" in batch:
        assert [s["tokens"] for s in shown] == (batch["document_ids"] >= 0).sum(axis=1).tolist()
    elif "image" in batch:
        assert [s["id"] for s in shown] == batch["id"].tolist()
        from PIL import Image

        assert len(shown) == len(batch["image"]) == 2
        for i, pixels in enumerate(batch["image"]):
            url = web + "/m/image?" + urlencode({**q.to_params(), "col": "image", "i": i})
            with urllib.request.urlopen(url, timeout=30) as resp:
                png = np.asarray(Image.open(io.BytesIO(resp.read())).convert("RGB"))
            assert np.array_equal(png, pixels)  # the pixels the page draws are the script's
    else:
        assert sorted(batch) == ["name"]  # the job's columns are kept
        assert [s["name"] for s in shown] == batch["name"].tolist() and len(shown) == 4


# --- a job's steps --------------------------------------------------------------------------------
def run_job(
    endpoint: str, store: str, world: int, batch: int, steps: int, commit_after: int, resume: str | None
) -> dict[int, list[list[int]]]:
    """`world` ranks of job `resized` on text@1 take `steps` steps, committing the steps done after
    `commit_after` of them; the ids each rank received, by the job's step (counted from 0)."""
    loaders = [
        Loader([endpoint], "text@1", batch_size=batch, rank=r, world_size=world, seed=5, columns=["id", "name"],
               job="resized", cursor_store=store, resume=resume)
        for r in range(world)
    ]
    try:
        first = loaders[0].resumed_from or 0
        iters = [iter(loader) for loader in loaders]
        got = {}
        for k in range(steps):
            got[first + k] = [next(it)["id"].tolist() for it in iters]
            if k + 1 == commit_after:
                for loader in loaders:
                    loader.commit(first + k + 1, wait=True)
    finally:
        for loader in loaders:
            loader.close()
    return got


def test_job_links_open_the_step_each_rank_received_across_a_world_size_change(
    page: Page, store: str, endpoint: str, root: Path, tmp_path: Path
) -> None:
    # 2 ranks x 3 take steps 0..3 and commit 3 (offset 18); resumed there on 4 ranks x 2, steps 3..6,
    # committing 5 (offset 34, which is no multiple of 8: step 5 is not at 5 x 8)
    received = run_job(endpoint, store, world=2, batch=3, steps=4, commit_after=3, resume=None)
    again = run_job(endpoint, store, world=4, batch=2, steps=4, commit_after=2, resume="latest")
    pg = page.open("/jobs/resized")
    rows = {
        int(tr.query_selector("td").inner_text()): [
            (a.get_attribute("href"), a.get_attribute("data-positions")) for a in tr.query_selector_all("a")
        ]
        for tr in pg.query_selector_all("#job tr")[1:]
    }
    assert sorted(rows) == [3, 5]
    assert [p for _, p in rows[3]] == ["18,21", "21,24"]  # the 2 ranks that committed 3
    assert [p for _, p in rows[5]] == ["34,36", "36,38", "38,40", "40,42"]  # the 4 that committed 5

    def explain(*args: str) -> subprocess.CompletedProcess[str]:
        from .support.processes import run_cli

        return run_cli("explain", "--job", "resized", *args, "--store", store, "--root", str(root), cwd=tmp_path)

    for checkpoint, links in rows.items():
        took = received if checkpoint == 3 else again  # the run that committed the checkpoint
        for rank, (href, positions) in enumerate(links):
            proc = explain("--step", str(checkpoint), "--rank", str(rank), "--json")
            assert proc.returncode == 0, proc.stderr
            said = json.loads(proc.stdout)["ranks"][0]["positions"]
            assert said == [int(p) for p in positions.split(",")], (checkpoint, rank)
            pg = page.open(href)
            assert [s["id"] for s in summaries(pg)] == took[checkpoint][rank]  # what that rank's Loader handed over
            assert sorted(summaries(pg)[0]) == ["id", "name", "row"]  # the job's columns
            assert pg.inner_text("#step-of").startswith(f"job step {checkpoint} ")
            if rank == 1:  # its "Copy as Python" reproduces what that rank received there
                script = tmp_path / f"job-{checkpoint}.py"
                script.write_text(pg.text_content("#reproduce") + "\nprint(batch['id'].tolist())\n")
                ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
                assert ran.returncode == 0 and ran.stdout.splitlines()[-1] == str(took[checkpoint][rank]), ran.stderr
            if checkpoint + 1 in took:
                pg.click("#next")  # the job's next step, on the same rank
                pg.wait_for_load_state("networkidle")
                assert [s["id"] for s in summaries(pg)] == took[checkpoint + 1][rank]
    # past the job's end (it runs one epoch): said, not placed in a later epoch
    proc = explain("--step", "500")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("shardstream: error: step 500 is past the job's end: job 'resized' runs 1 epoch(s)")


def test_a_balanced_jobs_step_shows_every_ranks_share(page: Page, store: str, endpoint: str) -> None:
    """balance={"cost": ...}: the job page links each rank's share of the step, and the step page lists
    every rank's rows and cost as each Loader received them (not a range of positions)."""
    kw = dict(batch_size=3, world_size=2, seed=5, columns=["id", "name"], job="balanced", cursor_store=store, balance={"cost": "id"})
    received = {}
    for r in range(2):
        with Loader([endpoint], "text@1", rank=r, **kw) as loader:  # type: ignore[arg-type]
            it = iter(loader)
            for _ in range(2):
                batch = next(it)
            loader.commit(2, wait=True)
            batch = next(it)  # the job's step 2: what the checkpoint's links open
            received[r] = (batch["id"].tolist(), loader.last_batch)
    pg = page.open("/jobs/balanced")
    links = pg.query_selector_all("#job a")
    assert len(links) == 2 and all("its share of positions" in a.inner_text() for a in links)
    pg = page.open(links[1].get_attribute("href"))
    assert [s["id"] for s in summaries(pg)] == received[1][0]
    rows = [[td.inner_text() for td in tr.query_selector_all("td")] for tr in pg.query_selector_all("#balance tr")[1:]]
    assert [int(r[0]) for r in rows] == [0, 1]
    for rank, cells in enumerate(rows):
        ids, info = received[rank]
        assert int(cells[1]) == len(ids) and float(cells[3]) == pytest.approx(info.cost) == pytest.approx(sum(ids))
    assert "balance={cost" not in pg.inner_text("#balance-why") and "balance=cost:id" in pg.inner_text("#balance-why")


def test_the_job_page_explains_each_ranks_step_time(page: Page, store: str, endpoint: str) -> None:
    """Two ranks of a balanced job commit step 3: the page's step-time table shows, per rank, what its
    record carries (steps, data wait, cost ratio, the estimated wait for the slowest rank); a job whose
    records predate timings shows — for each rank."""
    from shardstream.client import CursorRecord, open_store
    from shardstream.viz.step_time import explain

    kw = dict(batch_size=3, world_size=2, seed=5, job="explained", cursor_store=store, balance={"cost": "id"})
    loaders = [Loader([endpoint], "text@1", rank=r, **kw) for r in range(2)]  # type: ignore[arg-type]
    try:
        its = [iter(loader) for loader in loaders]
        for _ in range(3):
            for it in its:
                next(it)
        for loader in loaders:
            loader.commit(3, wait=True)
    finally:
        for loader in loaders:
            loader.close()
    st = open_store(store)
    try:
        records = [CursorRecord.from_bytes(raw, where="t").describe() for _, raw in sorted(st.read("explained", 3).items())]
    finally:
        st.close()
    expected = dict(explain(records))
    pg = page.open("/jobs/explained")
    rows = pg.query_selector_all("#step-time tr[data-rank]")
    assert [(r.get_attribute("data-checkpoint"), r.get_attribute("data-rank")) for r in rows] == [("3", "0"), ("3", "1")]
    for row in rows:
        e = expected[int(row.get_attribute("data-rank") or "")]
        assert e is not None and int(row.get_attribute("data-steps") or "") == e.steps == 3
        assert float(row.get_attribute("data-wait") or "") == pytest.approx(e.data_wait_s)
        cells = [td.inner_text() for td in row.query_selector_all("td")]
        assert float(cells[5]) == pytest.approx(e.cost_ratio, abs=5e-4)
        assert float(cells[6]) == pytest.approx(e.slowest_wait_s, rel=1e-3)
    assert {float(r.query_selector_all("td")[6].inner_text()) for r in rows} & {0.0}  # the larger share waits for nobody
    old = page.open("/jobs/train-1").query_selector_all("#step-time tr[data-rank]")
    assert len(old) == 2 and all(r.inner_text().split("\t")[2:] == ["—"] * 7 for r in old)


# --- the dense step view --------------------------------------------------------------------------
GRID = json.dumps([{"op": "image.decode", "column": "image", "size": [96, 96]}])


@pytest.fixture(scope="module")
def gallery(root: Path) -> str:
    """72 images (the viz registry's photos three times over): a step of 64 fits."""
    from shardstream.registry import Registry

    from .support.media import blob_table, real_images, write_table
    from .support.viz_data import matplotlib_photos

    try:
        return Registry(root).resolve("gallery").ref
    except LookupError:
        images = matplotlib_photos() + real_images()
        table = blob_table("image", images, repeat=3).rename_columns(["id", "name", "image"])
        return write_table(root, "gallery", table).ref


def test_a_step_of_64_images_is_a_grid_within_two_screens(page: Page, gallery: str, endpoint: str) -> None:
    q = StepQuery(gallery, batch_size=64, seed=2, transforms=GRID)
    pg = page.open("/step?" + urlencode(q.to_params()))
    height = pg.evaluate("document.documentElement.scrollHeight")
    print(f"page height of 64 images at 1280x900: {height} px")
    thumbs = pg.query_selector_all("#samples img.decoded")
    assert len(thumbs) == 64
    pg.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    pg.wait_for_function("() => [...document.querySelectorAll('#samples img')].every(i => i.complete)")
    assert all(img.evaluate("i => i.complete && i.naturalWidth === 96 && i.naturalHeight === 96") for img in thumbs)
    assert height <= 2 * 900, height
    # the rows are the batch a Loader received, in order, with their labels counted
    assert [s["id"] for s in summaries(pg)] == loader_batch(endpoint, q)["id"].tolist()
    # click to zoom: the received image beside the stored original
    big = zoomed(pg, thumbs[5])
    assert [i.get_attribute("class") for i in big] == ["decoded", "original"]
    for img in big:
        assert img.evaluate("i => i.complete && i.naturalWidth > 0") and variance(img.screenshot()) > 5.0


def test_text_rows_are_a_table_and_mixture_rows_are_coloured_and_counted_by_source(page: Page, endpoint: str) -> None:
    q = StepQuery(MIXTURE, world_size=2, batch_size=16, rank=1, step=1)
    pg = page.open("/step?" + urlencode(q.to_params()))
    height = pg.evaluate("document.documentElement.scrollHeight")
    print(f"page height of 16 text rows at 1280x900: {height} px")
    rows = pg.query_selector_all("table.dense#samples tr.card")
    assert len(rows) == 16 and height <= 2 * 900
    assert [s["id"] for s in summaries(pg)] == loader_batch(endpoint, q)["id"].tolist()
    refs = ["text@1", "notes@1"]  # the mixture's sources, in its order
    sources = [r.query_selector("td.prov").inner_text().split(" · ")[0] for r in rows]
    assert set(sources) <= set(refs) and len(set(sources)) == 2
    for source, row in zip(sources, rows, strict=True):
        assert f"src{refs.index(source)}" in (row.get_attribute("class") or "").split()
    counts = pg.inner_text("#counts")
    assert all(f"{ref} × {sources.count(ref)}" in counts for ref in refs)
    # per-column rendering: the long text folds into its first characters, the short fields are cells
    head = [th.inner_text() for th in pg.query_selector_all("table.dense th")]
    assert head[2:] == ["id", "name", "text"]
    assert len(pg.query_selector_all("table.dense td.text details")) == 16


def test_the_job_page_lists_the_checkpoints_the_fleet_keeps(root: Path, tmp_path: Path) -> None:
    """A server with --checkpoint-root keeps two checkpoints of job ckpt-run (each with its Loader's
    position): the job page lists them newest first with step, size, age, ranks and data position;
    a server without a checkpoint root says so on the page."""
    import re

    from shardstream.client.checkpoint import Checkpointer

    (tmp_path / "ck").mkdir()
    with Servers(root) as servers:
        server = servers.start(extra_args=("--checkpoint-root", str(tmp_path / "ck")))
        with Loader([server.target], "text@1", batch_size=4, seed=0) as loader, Checkpointer(
            [server.target], job="ckpt-run"
        ) as ck:
            it = iter(loader)
            for _ in range(2):
                next(it)
            ck.save(2, {"w": np.zeros(1024, np.float32)}, loader=loader, blocking=True)
            next(it)
            ck.save(3, {"w": np.ones(2048, np.float32)}, loader=loader, blocking=True)
            it.close()
        gen = serve_web(root, "--server", server.target, "--store", f"sqlite:///{tmp_path / 'none.db'}")
        base = next(gen)
        try:
            with urllib.request.urlopen(base + "/jobs/ckpt-run", timeout=30) as resp:
                html = resp.read().decode()
        finally:
            gen.close()
    rows = re.findall(
        r'<tr data-step="(\d+)" data-bytes="(\d+)"><td>\d+</td><td>[^<]+</td>\s*<td>(\d+)s</td><td>(\d+)</td><td>([^<]+)</td>',
        html,
    )
    assert [(step, ranks, position) for step, _, _, ranks, position in rows] == [
        ("3", "1", "epoch 0 offset 12, step 3"),
        ("2", "1", "epoch 0 offset 8, step 2"),
    ]
    assert [int(b) for _, b, _, _, _ in rows] == [2048 * 4, 1024 * 4]
    assert all(int(age) < 120 for _, _, age, _, _ in rows)


def test_the_job_page_says_when_the_servers_keep_no_checkpoints(web: str) -> None:
    with urllib.request.urlopen(web + "/jobs/train-1", timeout=30) as resp:
        html = resp.read().decode()
    assert '<p id="no-checkpoints">the servers keep no checkpoints (serve --checkpoint-root URL)</p>' in html
