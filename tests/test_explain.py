"""`shardstream explain` against what real ranks received.

Jobs run real Loaders (provenance=True) against a real server and commit cursors to an SQLite store;
`explain --job J --step T` must then name, rank by rank, exactly the (source,) shards and rows the
ranks' BatchInfo said they got at step T — across an epoch boundary, before the first cursor, after a
resume with another world and batch size, for a mixture with a non-default block — and
`explain DATASET --sample SHARD:ROW` must name the step and rank that received that sample. The walk
itself (`place_step`) is checked against a brute-force enumeration of steps.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.cli import main
from shardstream.client import Loader
from shardstream.order.explain import Cursor, place_of, place_step
from shardstream.order.read_order import StepLayout
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.drop_rows import drop_rows

from .support import media
from .support.data import N_ROWS, write_dataset
from .support.servers import Servers

TOKENIZE = [{"op": "text.tokenize", "column": "text", "tokenizer": "bytes"}]
MASKED_ROWS = [(1, 5), *((0, r) for r in range(20, 40)), *((2, r) for r in range(4)), (3, 29)]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explain") / "root"
    write_dataset(root, "toy", N_ROWS)
    write_dataset(root, "toy", N_ROWS, start=10_000)
    images = media.real_images()[:6]
    pics = images[:2] + [("bad-0.jpg", b"not an image")] + images[2:5] + [("bad-1.jpg", b"\xff\xd8 cut")]
    media.write_table(root, "pics", media.blob_table("image", pics), row_group_rows=3, shard_rows=6)
    # masked@2: masked@1 without some rows (drop_rows): one row, a whole row group, a shard's first rows
    write_dataset(root, "masked", 300, row_group_rows=20, shard_rows=70)
    drop_rows(Registry(root), "masked", rows=[*MASKED_ROWS])
    texts = [t[:400] for _, t in media.python_sources(30)]
    lengths = pa.array([len(t.encode("utf-8")) for t in texts], pa.int32())
    media.write_table(root, "docs", pa.table({"text": texts, "n_tokens": lengths}), row_group_rows=7, shard_rows=21)
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[LocalServer]:
    with Servers(root) as servers:
        yield servers.start()


def explain(root: Path, store: str, *args: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["explain", *args, "--root", str(root), "--store", store, "--json"])
    assert code == 0
    return json.loads(out.getvalue())


def run(server: LocalServer, dataset: Any, steps: int, commits: tuple[int, ...], **kw: Any) -> dict[int, Any]:
    """Take `steps` batches, commit after `commits` of them; the job step -> BatchInfo of each."""
    got = {}
    with Loader([server.target], dataset, provenance=True, epochs=None, **kw) as ld:
        first = ld.state_dict()["steps"]  # where a resumed job continues
        for i, _ in enumerate(ld):
            got[first + i] = ld.last_batch
            if first + i + 1 in commits:
                ld.commit(first + i + 1, wait=True)  # every checkpoint lands (a lagging committer writes only the newest)
            if i + 1 == steps:
                break
        ld.flush_commits()
    return got


def rows_of(info: Any, sources: list[str] | None = None) -> list[tuple[Any, ...]]:
    shards, rows = info.shards.tolist(), info.rows.tolist()
    if sources is None:
        return list(zip(shards, rows, strict=True))
    return list(zip([sources[s] for s in info.sources.tolist()], shards, rows, strict=True))


def test_a_jobs_steps_are_what_its_ranks_received(server: LocalServer, root: Path, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/cursors.db"
    job = dict(job="run-1", cursor_store=store, seed=5, shuffle="block", shuffle_window=4)
    # world 2 x 16: 32 steps an epoch (the last of 17 samples, split 8 / 9); 45 steps cross into epoch 1
    first = {
        r: run(server, "toy@1", 45, (10, 40), batch_size=16, rank=r, world_size=2, transforms=TOKENIZE, **job)
        for r in range(2)
    }
    # resumed at checkpoint 40 with world 1 x 24
    second = run(server, "toy@1", 10, (45,), batch_size=24, rank=0, world_size=1, resume="latest", **job)
    assert min(second) == 40
    for t in (0, 9, 10, 31, 32, 39, 44):
        out = explain(root, store, "--job", "run-1", "--step", str(t))
        assert out["world_size"] == 2 and out["from_cursor"]["steps"] == (10 if t < 40 else 40), t
        assert [r["rank"] for r in out["ranks"]] == [0, 1]
        for r in out["ranks"]:
            assert [(s["shard"], s["row"]) for s in r["samples"]] == rows_of(first[r["rank"]][t]), (
                t,
                r["rank"],
            )
            assert r["positions"] == [first[r["rank"]][t].position_start, first[r["rank"]][t].position_end]
            assert r["skipped"] == []  # on_error="fail": nothing is ever left out
        assert (
            out["epoch"] == first[0][t].epoch and out["transforms"] == TOKENIZE and out["on_error"] == "fail"
        )
    assert explain(root, store, "--job", "run-1", "--step", "31")["ranks"][1]["positions"][1] == N_ROWS
    for t in (45, 49):
        out = explain(root, store, "--job", "run-1", "--step", str(t), "--rank", "0")
        assert out["world_size"] == 1 and out["batch_size"] == 24 and out["from_cursor"]["checkpoint"] == 45
        assert [(s["shard"], s["row"]) for s in out["ranks"][0]["samples"]] == rows_of(second[t])
        assert out["transforms"] == []
    # where each sample of a step landed, asked the other way round
    for t, r in ((3, 1), (33, 0)):
        info = first[r][t]
        for shard, row in rows_of(info)[:3]:
            where = explain(
                root, store, "toy@1", "--sample", f"{shard}:{row}", "--seed", "5", "--shuffle", "block",
                "--window", "4", "--world-size", "2", "--batch-size", "16", "--epoch", str(info.epoch),
            )  # fmt: skip
            assert (where["job_step"], where["rank"]) == (t, r)


PACK = [*TOKENIZE, {"op": "text.pack", "seq_len": 96, "lengths": "n_tokens"}]


@pytest.mark.parametrize(("balance", "transforms"), [("attention", PACK), ({"cost": "n_tokens"}, [])])
def test_a_balanced_jobs_steps_say_which_rank_got_what(
    server: LocalServer, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], balance: Any, transforms: Any
) -> None:
    """balance=: explain splits the step as the servers did — each rank's samples (not a range), rows,
    tokens and cost — from the costs the dataset keeps."""
    store = f"sqlite:///{tmp_path}/cursors.db"
    job = dict(job="bal", cursor_store=store, seed=5, balance=balance, transforms=transforms)
    got = {r: run(server, "docs@1", 4, (2,), batch_size=3, rank=r, world_size=2, **job) for r in range(2)}
    for t in (2, 3):
        out = explain(root, store, "--job", "bal", "--step", str(t))
        mode = balance if isinstance(balance, str) else "cost"
        assert out["balance"]["mode"] == mode and out["balance"]["why"], out["balance"]
        costs = [got[r][t].cost for r in range(2)]
        assert out["balance"]["cost_max_over_mean"] == pytest.approx(max(costs) / (sum(costs) / 2), rel=1e-3)
        for r in out["ranks"]:
            info = got[r["rank"]][t]
            assert r["cost"] == pytest.approx(info.cost) and r["positions"] == [info.position_start, info.position_end]
            if mode == "cost":  # the rank's samples themselves, in order
                assert [(s["shard"], s["row"]) for s in r["samples"]] == rows_of(info)
            else:
                assert r["tokens"] == info.tokens and r["rows"] == len(info.rows)
    assert main(["explain", "--job", "bal", "--step", "3", "--root", str(root), "--store", store]) == 0
    text = capsys.readouterr().out
    assert f"balance={out['balance']['mode']}" in text and "x the step's mean" in text


def test_a_mixture_jobs_steps(server: LocalServer, root: Path, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/cursors.db"
    mix = {"toy@1": 0.7, "toy@2": 0.3}
    kw = dict(job="mix", cursor_store=store, batch_size=8, world_size=2, seed=3, mixture_block=50)
    got = {r: run(server, mix, 12, (6,), rank=r, **kw) for r in range(2)}
    for t in (2, 6, 11):  # before, at and after the cursor
        out = explain(root, store, "--job", "mix", "--step", str(t))
        for r in out["ranks"]:
            received = rows_of(got[r["rank"]][t], ["toy@1", "toy@2"])
            assert [(s["source"], s["shard"], s["row"]) for s in r["samples"]] == received, (t, r["rank"])


PHASES = [(0, {"toy@1": 0.7, "toy@2": 0.3}), (300, {"toy@1": 0.2, "toy@2": 0.8}), (900, {"toy@2": 1.0})]


@pytest.mark.parametrize(("seed", "world", "batch"), [(3, 2, 8), (8, 3, 5)])
def test_a_mixture_phases_jobs_steps_and_samples(
    server: LocalServer, root: Path, tmp_path: Path, seed: int, world: int, batch: int
) -> None:
    """Mixture phases (curriculum): explain --job names, rank by rank, the source, shard and row each
    rank received, in every phase and across the mixture's epoch boundary; explain MIX --sample
    --source S names the step and rank that received a sample (the plan's lookup inverted)."""
    store = f"sqlite:///{tmp_path}/cursors.db"
    kw = dict(
        job="phases", cursor_store=store, batch_size=batch, world_size=world, seed=seed, mixture_block=50
    )
    per_epoch = -(-2 * N_ROWS // (world * batch))  # the mixture epoch: both sources' rows
    steps = per_epoch + 4
    got = {r: run(server, PHASES, steps, (9, per_epoch), rank=r, **kw) for r in range(world)}
    label = "0=toy@1:0.7,toy@2:0.3;300=toy@1:0.2,toy@2:0.8;900=toy@2:1"
    for t in (0, 8, 9, 300 // (world * batch) + 1, per_epoch - 1, per_epoch, steps - 1):
        out = explain(root, store, "--job", "phases", "--step", str(t))
        for r in out["ranks"]:
            received = rows_of(got[r["rank"]][t], ["toy@1", "toy@2"])
            assert [(s["source"], s["shard"], s["row"]) for s in r["samples"]] == received, (t, r["rank"])
    for t, r in ((1, 0), (2000 // (world * batch), world - 1), (per_epoch + 2, 0)):
        info = got[r][t]
        for source, shard, row in rows_of(info, ["toy@1", "toy@2"])[:3]:
            where = explain(
                root, store, label, "--sample", f"{shard}:{row}", "--source", source, "--seed", str(seed),
                "--world-size", str(world), "--batch-size", str(batch), "--epoch", str(info.epoch),
                "--mixture-block", "50",
            )  # fmt: skip
            hits = [(o["job_step"], o["rank"]) for o in where["occurrences"]]
            assert (t, r) in hits, (source, shard, row, hits)


def test_a_sample_of_a_plain_mixture_lands_where_ranks_received_it(
    server: LocalServer, root: Path, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/cursors.db"
    mix = {"toy@1": 0.7, "toy@2": 0.3}
    kw = dict(job="mixs", cursor_store=store, batch_size=8, world_size=2, seed=6, mixture_block=40)
    got = {r: run(server, mix, 20, (5,), rank=r, **kw) for r in range(2)}
    for t, r in ((0, 1), (17, 0)):
        for source, shard, row in rows_of(got[r][t], ["toy@1", "toy@2"])[:4]:
            where = explain(
                root, store, "toy@1:0.7,toy@2:0.3", "--sample", f"{shard}:{row}", "--source", source,
                "--seed", "6", "--world-size", "2", "--batch-size", "8", "--mixture-block", "40",
            )  # fmt: skip
            assert (t, r) in [(o["job_step"], o["rank"]) for o in where["occurrences"]]
            assert where["source"] == source


def test_a_scheduled_jobs_steps(server: LocalServer, root: Path, tmp_path: Path) -> None:
    """Batch-size phases and skip ranges (schedule_state.py): explained from the job's start and
    from its cursors, as the ranks received them."""
    store = f"sqlite:///{tmp_path}/cursors.db"
    kw = dict(job="sched", cursor_store=store, world_size=2, seed=2, batch_size=[(0, 8), (200, 16)])
    got = {r: run(server, "toy@1", 40, (10, 25), rank=r, skip_steps=[(3, 5)], **kw) for r in range(2)}
    for t in (0, 2, 3, 9, 12, 13, 25, 39):
        out = explain(root, store, "--job", "sched", "--step", str(t))
        assert out["schedule"] is not None
        for r in out["ranks"]:
            info = got[r["rank"]][t]
            assert [(s["shard"], s["row"]) for s in r["samples"]] == rows_of(info), (t, r["rank"])
            assert r["positions"] == [info.position_start, info.position_end] and out["epoch"] == info.epoch


@pytest.mark.parametrize(
    ("seed", "world", "batch", "shuffle"), [(4, 2, 8, "block"), (9, 3, 5, "full"), (1, 1, 7, "none")]
)
def test_a_masked_versions_steps_and_samples_are_the_rows_a_server_delivers(
    server: LocalServer, root: Path, tmp_path: Path, seed: int, world: int, batch: int, shuffle: str
) -> None:
    """masked@2 holds 274 of its files' 300 rows (drop_rows): explain maps its positions to the rows
    the server delivers — by step, and a delivered row back to its step and rank — and says that a
    masked row is never delivered."""
    store = f"sqlite:///{tmp_path}/cursors.db"
    kw = dict(
        job="masked", cursor_store=store, batch_size=batch, world_size=world, seed=seed, shuffle=shuffle
    )
    per_epoch = -(-274 // (world * batch))
    got = {r: run(server, "masked@2", per_epoch + 5, (7,), rank=r, **kw) for r in range(world)}
    delivered = [row for r in got for info in got[r].values() for row in rows_of(info)]
    assert not set(delivered) & set(MASKED_ROWS) and len(delivered) > 274
    for t in (0, 6, 7, per_epoch - 1, per_epoch, per_epoch + 4):
        out = explain(root, store, "--job", "masked", "--step", str(t))
        for r in out["ranks"]:
            assert [(s["shard"], s["row"]) for s in r["samples"]] == rows_of(got[r["rank"]][t]), (
                t,
                r["rank"],
            )
    for t, r in ((2, world - 1), (per_epoch + 1, 0)):
        info = got[r][t]
        for shard, row in rows_of(info)[:4]:
            where = explain(
                root, store, "masked@2", "--sample", f"{shard}:{row}", "--seed", str(seed), "--shuffle", shuffle,
                "--world-size", str(world), "--batch-size", str(batch), "--epoch", str(info.epoch),
            )  # fmt: skip
            assert (where["job_step"], where["rank"]) == (t, r), (shard, row)
            assert info.position_start <= where["position"] < info.position_end
    for shard, row in MASKED_ROWS[::7]:
        where = explain(
            root, store, "masked@2", "--sample", f"{shard}:{row}", "--world-size", "1", "--batch-size", "4"
        )
        assert where["position"] is None and where["note"].startswith("masked"), (shard, row)


def test_samples_a_transform_skipped_are_read_with_server(
    server: LocalServer, root: Path, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/cursors.db"
    decode = [{"op": "image.decode", "size": [8, 8]}]
    kw = dict(job="pics", cursor_store=store, batch_size=2, world_size=1, rank=0, seed=1, columns=["image"])
    got = run(server, "pics@1", 4, (4,), transforms=decode, on_error="skip", **kw)
    assert any(info.skipped for info in got.values())
    for t, info in got.items():
        blind = explain(root, store, "--job", "pics", "--step", str(t))
        assert blind["ranks"][0]["skipped"] is None  # unknown without reading the data
        out = explain(root, store, "--job", "pics", "--step", str(t), "--server", server.target)
        assert [s["position"] for s in out["ranks"][0]["skipped"]] == [s.position for s in info.skipped]
        # what the plan gave, skipped ones included
        assert len(out["ranks"][0]["samples"]) == info.position_end - info.position_start


def test_explain_needs_a_job_or_a_sample(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = f"sqlite:///{tmp_path}/none.db"
    assert main(["explain", "--root", str(root), "--store", store]) == 1
    assert main(["explain", "--job", "nope", "--step", "0", "--root", str(root), "--store", store]) == 1
    err = capsys.readouterr().err
    assert "give either --job" in err and "has no cursors" in err


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 200),
    w=st.integers(1, 5),
    b=st.integers(1, 9),
    drop=st.booleans(),
    at=st.integers(0, 40),
    t=st.integers(0, 60),
)
def test_place_step_walks_the_plan_like_a_loader(n: int, w: int, b: int, drop: bool, at: int, t: int) -> None:
    """From a cursor at any step of a job that ran from (0, 0), every step lands where stepping gets."""
    steps = []  # (epoch, global range) of the job's steps in order
    epoch, per_epoch = 0, StepLayout(n, 0, w, b, drop)
    if per_epoch.num_steps == 0:
        return
    while len(steps) <= max(at, t):
        steps += [(epoch, per_epoch.global_range(k)) for k in range(per_epoch.num_steps)]
        epoch += 1
    e, (offset, _) = steps[at]
    place = place_step(n, Cursor(e, offset, at, w, b, drop), t)
    assert (place.epoch, place.layout.global_range(place.index)) == steps[t]
    start, end = steps[t][1]
    for p in {start, end - 1}:
        assert place_of(place.layout, p)[0] == place.index  # type: ignore[index]


def test_a_step_after_an_older_clients_newest_checkpoint_is_placed_with_a_note(root: Path, tmp_path: Path) -> None:
    """Cursors written without the job's epochs (older clients): a step past the newest checkpoint is
    still placed, and the answer says that it is past what the job is known to have run."""
    from shardstream.client.cursors.records import CursorRecord
    from shardstream.client.cursors.stores import open_store
    from shardstream.client.loader_state import LoaderState

    fingerprint = Registry(root).resolve("toy@1").fingerprint
    store = f"sqlite:///{tmp_path}/cursors.db"
    st = open_store(store)
    try:
        state = LoaderState("toy@1", fingerprint, 0, "block(window=16)", 0, 90, 1, 10, 9).to_dict()
        del state["epochs"]  # as an older client wrote it
        rec = CursorRecord("old-job", 0, 9, LoaderState.from_dict(state))
        st.write("old-job", 9, rec.key, 0, 1, rec.to_bytes())
    finally:
        st.close()
    out = explain(root, store, "--job", "old-job", "--step", str(9 + 3 * (N_ROWS // 10)))
    assert out["epoch"] >= 2 and out["note"].startswith(f"step {9 + 3 * (N_ROWS // 10)} is after the job's newest checkpoint (step 9")
    assert "note" not in explain(root, store, "--job", "old-job", "--step", "9")
