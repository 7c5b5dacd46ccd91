"""A registry that survives one bad file (DESIGN §3): an unreadable manifest is DATA_LOSS for that
version only, a symlinked dataset directory for that dataset only; everything else lists, resolves
and reads — in the registry, through a real server and through the command line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow.parquet as pq
import pytest

from shardstream.client import Loader
from shardstream.errors import DataLossError
from shardstream.registry import BadEntry, Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest
from shardstream.v1 import shardstream_pb2 as pb

from .support.bad_registry import MANIFEST_KINDS, break_manifest, link_dataset, several_datasets, tree
from .support.data import make_table, write_dataset
from .support.processes import run_cli
from .support.servers import scrape


def assert_client_safe(message: str, *roots: Path) -> None:
    """No server path, no Python exception text."""
    for root in roots:
        assert str(root) not in message and str(root.resolve()) not in message, message
    assert "Error" not in message and "Errno" not in message and "Traceback" not in message, message


# --- the registry --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", MANIFEST_KINDS)
def test_one_bad_manifest_is_data_loss_for_that_version_only(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    several_datasets(root)
    break_manifest(root, "alpha", 1, kind, monkeypatch)
    reg = Registry(root)

    with pytest.raises(DataLossError) as err:
        reg.resolve("alpha@1")
    assert str(err.value).startswith("dataset alpha@1: its manifest "), err.value
    assert_client_safe(str(err.value), root)

    assert reg.resolve("alpha").version == 2 and reg.resolve("alpha@2").num_rows == 200
    assert reg.resolve("beta").num_rows == 150
    listing = reg.listing()
    assert [(m.name, m.version) for m in listing.manifests] == [("alpha", 2), ("beta", 1), ("gamma", 2)]
    assert listing.bad == []  # listing reads the latest versions only
    assert [isinstance(v, BadEntry) for v in reg.manifests("alpha")] == [True, False]
    assert write_dataset(root, "beta", 10).ref == "beta@2"  # others keep taking new versions


def test_a_bad_latest_version_fails_by_name_and_tag_and_is_reported_by_listing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    several_datasets(root)
    break_manifest(root, "gamma", 2, "truncated")
    reg = Registry(root)
    (root / "gamma" / "tags").mkdir()
    (root / "gamma" / "tags" / "prod").write_text("2\n")
    (root / "gamma" / "tags" / "old").write_text("1\n")
    (root / "gamma" / "tags" / "mangled").write_text("two\n")
    for ref in ("gamma", "gamma@2", "gamma@prod"):
        with pytest.raises(DataLossError, match=r"^dataset gamma@2: its manifest is not valid JSON"):
            reg.resolve(ref)  # never an older version in its place
    assert reg.resolve("gamma@1").version == 1 and reg.resolve("gamma@old").version == 1
    with pytest.raises(DataLossError, match="tag gamma@mangled is malformed"):
        reg.resolve("gamma@mangled")
    listing = reg.listing()
    assert [m.ref for m in listing.manifests] == ["alpha@2", "beta@1"]
    assert [(b.ref, b.reason) for b in listing.bad] == [
        ("gamma@2", "its manifest is not valid JSON (truncated or overwritten?)")
    ]
    assert "JSONDecodeError" in listing.bad[0].detail  # for operators, not clients


def test_symlinked_dataset_directories_are_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    several_datasets(root)
    elsewhere = tmp_path / "elsewhere"
    write_dataset(elsewhere, "ext", 50)
    link_dataset(root, "ext", elsewhere / "ext")  # out of the root
    link_dataset(root, "alias", root / "alpha")  # inside it: still another dataset's files
    reg = Registry(root)
    for ref in ("ext", "ext@1", "alias", "alias@2"):
        with pytest.raises(DataLossError, match=r"^dataset (ext|alias): its directory is a symbolic link"):
            reg.resolve(ref)
    listing = reg.listing()
    assert [m.ref for m in listing.manifests] == ["alpha@2", "beta@1", "gamma@2"]
    assert sorted(b.ref for b in listing.bad) == ["alias", "ext"]
    assert reg.names() == ["alpha", "beta", "gamma"]


def test_a_manifests_directory_that_cannot_be_listed_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    several_datasets(root)
    # FAULT INJECTION (tests run as root, whom file modes do not stop): listing gamma's manifests fails.
    victim = str(root / "gamma" / "manifests")
    real = os.scandir

    def scandir(path: object = ".") -> object:
        if str(path) == victim:
            raise PermissionError(13, "Permission denied", victim)
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    reg = Registry(root)
    listing = reg.listing()
    assert [m.ref for m in listing.manifests] == ["alpha@2", "beta@1"]
    assert [(b.ref, b.reason) for b in listing.bad] == [("gamma", "its versions cannot be listed")]
    with pytest.raises(DataLossError, match="^dataset gamma: its versions cannot be listed$"):
        reg.resolve("gamma")  # which is the latest is unknown
    assert reg.resolve("gamma@1").version == 1  # a version named explicitly is read as it is


# --- writers -------------------------------------------------------------------------------------
def test_a_new_version_over_a_bad_latest_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    root = tmp_path / "root"
    several_datasets(root)
    break_manifest(root, "gamma", 2, "wrong_schema")
    src = tmp_path / "more.parquet"
    pq.write_table(make_table(40), src)
    before = tree(root / "gamma")
    for change in (None, "append"):
        with pytest.raises(DataLossError) as err:
            ingest(src, "gamma", root, IngestOptions(progress=False), change=change)
        assert "cannot write a new version of gamma: its latest version gamma@2 is unreadable" in str(
            err.value
        )
    assert tree(root / "gamma") == before  # no shard, no manifest, no number taken

    r = run_cli("ingest", str(src), "--name", "gamma", "--root", str(root), "-q", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert "gamma@2 is unreadable" in r.stderr and "RUNBOOK" in r.stderr
    r = run_cli("register", "gamma", "--from", "data", "--root", str(root), "-q", cwd=tmp_path)
    assert r.returncode == 1 and "gamma@2 is unreadable" in r.stderr, r.stderr
    assert tree(root / "gamma") == before

    # Other datasets: ingest and verify as before.
    r = run_cli("ingest", str(src), "--name", "beta", "--root", str(root), "-q", cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, "beta@2\n"), r.stderr
    r = run_cli("datasets", "verify", "beta", "--root", str(root), "-q", cwd=tmp_path)
    assert r.returncode == 0 and "all" in r.stdout, r.stderr


# --- a real server and the command line ---------------------------------------------------------
@pytest.fixture
def broken_root(tmp_path: Path) -> Path:
    """Several datasets, one truncated latest manifest (gamma@2), one symlinked directory (delta)."""
    root = tmp_path / "root"
    several_datasets(root)
    break_manifest(root, "gamma", 2, "truncated")
    link_dataset(root, "delta", root / "beta")
    return root


@pytest.fixture
def server(broken_root: Path, tmp_path: Path) -> Iterator[LocalServer]:
    with LocalServer(broken_root, metrics=True, log_path=tmp_path / "server.log") as s:
        yield s


def test_through_a_real_server_every_other_dataset_lists_resolves_and_reads(
    server: LocalServer, broken_root: Path, tmp_path: Path
) -> None:
    with grpc.insecure_channel(server.target) as ch:
        get = ch.unary_unary(
            "/shardstream.v1.ShardStream/GetDataset",
            request_serializer=pb.GetDatasetRequest.SerializeToString,
            response_deserializer=pb.DatasetInfo.FromString,
        )
        lst = ch.unary_unary(
            "/shardstream.v1.ShardStream/ListDatasets",
            request_serializer=pb.ListDatasetsRequest.SerializeToString,
            response_deserializer=pb.ListDatasetsResponse.FromString,
        )
        for _ in range(3):
            listed = [(d.name, d.version) for d in lst(pb.ListDatasetsRequest(), timeout=10).datasets]
            assert listed == [("alpha", 2), ("beta", 1)]
        for ref, rows in (("alpha", 200), ("alpha@1", 300), ("beta", 150), ("gamma@1", 120)):
            assert get(pb.GetDatasetRequest(dataset=ref), timeout=10).num_rows == rows, ref
        for ref, named in (("gamma", "gamma@2"), ("gamma@2", "gamma@2"), ("delta", "delta")):
            with pytest.raises(grpc.RpcError) as err:
                get(pb.GetDatasetRequest(dataset=ref), timeout=10)
            assert err.value.code() == grpc.StatusCode.DATA_LOSS, ref
            assert err.value.details().startswith(f"dataset {named}: "), err.value.details()
            assert_client_safe(err.value.details(), broken_root, tmp_path)

    for ref, first in (("alpha@2", 1000), ("beta", 0), ("gamma@1", 0)):
        with Loader([server.target], ref, batch_size=64, shuffle=False, timeout_s=30) as ld:
            ids = np.concatenate([b["id"] for b in ld])
        assert ids.tolist() == list(range(first, first + len(ids))) and len(ids) > 0, ref
    with Loader([server.target], "gamma", batch_size=8, timeout_s=30) as ld, pytest.raises(DataLossError):
        next(iter(ld))

    metrics = scrape(server)
    assert metrics["shardstream_registry_bad_entries"] == 2
    log = (tmp_path / "server.log").read_text()
    assert log.count("registry entry gamma@2") == 1 and log.count("registry entry delta") == 1, log


def test_the_command_line_lists_the_good_and_warns_about_the_bad(broken_root: Path, tmp_path: Path) -> None:
    root = str(broken_root)
    r = run_cli("datasets", "list", "--root", root, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["NAME", "alpha", "beta"]
    warnings = r.stderr.splitlines()
    assert len(warnings) == 2 and all(w.startswith("shardstream: warning: ") for w in warnings), warnings
    assert "delta: its directory is a symbolic link (not followed); skipped" in warnings[0]
    assert "gamma@2: its manifest is not valid JSON (truncated or overwritten?); skipped" in warnings[1]
    assert str(broken_root / "gamma" / "manifests" / "2.json") in warnings[1]  # where to look

    r = run_cli("datasets", "list", "--root", root, "--json", cwd=tmp_path)
    out = json.loads(r.stdout)
    assert [(d["name"], d["latest"]) for d in out["datasets"]] == [("alpha", 2), ("beta", 1)]
    assert [(b["dataset"], b["version"]) for b in out["bad"]] == [("delta", None), ("gamma@2", 2)]

    r = run_cli("datasets", "show", "gamma", "--root", root, cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("shardstream: error: dataset gamma@2: its manifest")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    r = run_cli("datasets", "show", "gamma@1", "--root", root, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("gamma@1"), r.stderr
    r = run_cli("datasets", "history", "gamma", "--root", root, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [(h["version"], "unreadable" in h) for h in json.loads(r.stdout)] == [(1, False), (2, True)]
    for name in ("alpha", "beta"):
        r = run_cli("datasets", "verify", name, "--root", root, "-q", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    r = run_cli("datasets", "verify", "delta", "--root", root, "-q", cwd=tmp_path)
    assert r.returncode == 1 and "dataset delta: its directory is a symbolic link" in r.stderr
