"""The checkpoint plane as an attacker, a noisy neighbour and a fault would meet it, through real
server processes on loopback: authentication before parsing, bounded bodies and writers, a full
root, corrupt and missing chunks, damaged manifests, a server restarted under follow()."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from shardstream.checkpoint_format import CHUNK_SCHEMA, chunk_hash, chunk_key, manifest_key
from shardstream.client.checkpoint import Checkpointer
from shardstream.errors import (
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    ShardstreamError,
    UnauthenticatedError,
    from_flight_error,
)

from .support.servers import Servers, scrape

torch = pytest.importorskip("torch")

TOKEN = "limits-token-1"
SUPPORT = Path(__file__).parent / "support"


def _auth_file(tmp: Path) -> Path:
    from shardstream.server.policy.auth import token_sha256

    path = tmp / "auth.yaml"
    path.write_text(
        "principals:\n"
        f"  - name: trainer\n    token_sha256: \"{token_sha256(TOKEN)}\"\n    datasets: []\n    checkpoints: ['*']\n"
    )
    return path


@pytest.fixture(scope="module")
def limited(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """A server with --auth and small limits: 1 MiB records and chunks, a 3 MiB quota per job."""
    tmp = tmp_path_factory.mktemp("cklimits")
    root = tmp / "ck"
    args = (
        "--checkpoint-root", str(root), "--auth", str(_auth_file(tmp)),
        "--checkpoint-max-record-mib", "1", "--checkpoint-max-chunk-mib", "1",
        "--checkpoint-inflight-mib", "4", "--checkpoint-job-quota-gib", str(3 / 1024),
    )  # fmt: skip
    with Servers(data_root) as servers:
        yield servers.start(metrics=True, extra_args=args), root


def _flight(server: Any) -> flight.FlightClient:
    return flight.connect(f"grpc+tcp://127.0.0.1:{server.data_port}")


def _options(token: str | None = TOKEN) -> flight.FlightCallOptions:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return flight.FlightCallOptions(headers=headers, timeout=60)


def _error(fn: Any) -> ShardstreamError:
    try:
        fn()
    except (flight.FlightError, pa.ArrowException) as exc:
        return from_flight_error(exc)
    raise AssertionError("the call succeeded")


def _action(client: flight.FlightClient, kind: str, body: bytes, token: str | None = TOKEN) -> Any:
    return list(client.do_action(flight.Action(kind, body), _options(token)))


def _put(
    client: flight.FlightClient,
    descriptor: dict[str, Any],
    batches: list[pa.RecordBatch],
    schema: pa.Schema = CHUNK_SCHEMA,
    token: str | None = TOKEN,
) -> None:
    command = flight.FlightDescriptor.for_command(json.dumps(descriptor).encode())
    writer, reader = client.do_put(command, schema, _options(token))
    for b in batches:
        writer.write_batch(b)
    writer.done_writing()
    reader.read()
    writer.close()


# --- 1. the caller before the body ------------------------------------------------------------------
@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_bodies_are_not_parsed_before_the_caller_is_known(limited: Any, token: str | None) -> None:
    server, _ = limited
    deep = b"[" * 100_000 + b"]" * 100_000
    big = b'{"job": "' + b"x" * (3 << 20) + b'"}'
    with _flight(server) as client:
        for body in (deep, big):
            err = _error(lambda: _action(client, "checkpoint.steps", body, token))  # noqa: B023
            assert isinstance(err, UnauthenticatedError), err
        err = _error(lambda: _put(client, {"op": "chunks", "job": "x", "hashes": []}, [], token=token))
        assert isinstance(err, UnauthenticatedError), err


def test_checkpoint_calls_count_in_the_data_planes_rpc_metrics(limited: Any) -> None:
    server, _ = limited
    flight_labels = 'grpc_service="arrow.flight.protocol.FlightService"'

    def handled(method: str, kind: str, code: str) -> float:
        return scrape(server)[f'grpc_server_handled_total{{grpc_code="{code}",grpc_method="{method}",{flight_labels},grpc_type="{kind}"}}']

    before = (handled("DoAction", "server_stream", "Unauthenticated"), handled("DoPut", "bidi_stream", "Unauthenticated"),
              handled("DoAction", "server_stream", "OK"), handled("ListFlights", "server_stream", "InvalidArgument"))  # fmt: skip
    with _flight(server) as client:
        _error(lambda: _action(client, "checkpoint.steps", b"{}", None))
        _error(lambda: _put(client, {"op": "chunks", "job": "x", "hashes": []}, [], token=None))
        _action(client, "checkpoint.steps", json.dumps({"job": "counted"}).encode())
        _error(lambda: list(client.list_flights(b"bad name!", _options())))
    after = (handled("DoAction", "server_stream", "Unauthenticated"), handled("DoPut", "bidi_stream", "Unauthenticated"),
             handled("DoAction", "server_stream", "OK"), handled("ListFlights", "server_stream", "InvalidArgument"))  # fmt: skip
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1, 1]


def test_a_known_caller_gets_one_line_for_deep_or_big_bodies(limited: Any) -> None:
    server, _ = limited
    with _flight(server) as client:
        for depth in (100, 100_000):
            body = b'{"job": ' + b"[" * depth + b"]" * depth + b"}"
            err = _error(lambda: _action(client, "checkpoint.steps", body))  # noqa: B023
            assert isinstance(err, InvalidArgumentError) and "nests deeper than 64" in str(err), err
        big = b'{"job": "' + b"x" * (2 << 20) + b'"}'
        err = _error(lambda: _action(client, "checkpoint.steps", big))
        assert isinstance(err, InvalidArgumentError) and "--checkpoint-max-record-mib" in str(err), err


# --- 2. writers ---------------------------------------------------------------------------------------
def _chunk_batch(data: bytes, h: str | None = None) -> pa.RecordBatch:
    return pa.record_batch([pa.array([h or chunk_hash(data)]), pa.array([data], pa.binary())], schema=CHUNK_SCHEMA)


def test_writers_are_bounded(limited: Any) -> None:
    server, root = limited
    job = "bounded"
    with _flight(server) as client:
        big = os.urandom((1 << 20) + 1)  # one byte over --checkpoint-max-chunk-mib
        err = _error(lambda: _put(client, {"op": "chunks", "job": job, "hashes": [chunk_hash(big)]}, [_chunk_batch(big)]))
        assert isinstance(err, InvalidArgumentError) and "--checkpoint-max-chunk-mib" in str(err), err
        small = b"fits"
        other = b"not named"
        err = _error(lambda: _put(client, {"op": "chunks", "job": job, "hashes": [chunk_hash(small)]}, [_chunk_batch(small), _chunk_batch(other)]))
        assert isinstance(err, InvalidArgumentError) and "does not name" in str(err), err
        assert not (root / chunk_key(job, chunk_hash(small))).exists()  # a failed DoPut leaves what it stored
        err = _error(lambda: _put(client, {"op": "chunks", "job": job}, [_chunk_batch(small)]))
        assert isinstance(err, InvalidArgumentError), err  # a DoPut names its chunks
        for schema, column in (
            (pa.schema([("hash", pa.string()), ("data", pa.binary())]), pa.array([None], pa.binary())),
            (pa.schema([("hash", pa.string()), ("data", pa.int64())]), pa.array([7], pa.int64())),
        ):
            batch = pa.record_batch([pa.array([chunk_hash(small)]), column], schema=schema)
            err = _error(lambda: _put(client, {"op": "chunks", "job": job, "hashes": [chunk_hash(small)]}, [batch], schema))  # noqa: B023
            assert isinstance(err, InvalidArgumentError) and "without nulls" in str(err), err
        for world in (10**7, True, 0, "3"):
            body = json.dumps({"job": job, "step": 1, "world_size": world, "save_id": "s"}).encode()
            err = _error(lambda: _action(client, "checkpoint.commit", body))  # noqa: B023
            assert isinstance(err, InvalidArgumentError) and "world_size" in str(err), (world, err)
        body = json.dumps({"job": job, "step": "latest"}).encode()
        err = _error(lambda: _action(client, "checkpoint.manifest", body))
        assert isinstance(err, NotFoundError) and "no committed checkpoint" in str(err), err


def test_a_job_over_its_quota_is_resource_exhausted_and_keeps_nothing_of_the_save(
    limited: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server, root = limited
    with Checkpointer([server.target], job="quota", token=TOKEN, chunk_bytes=256 << 10) as ck:
        ck.save(1, {"w": torch.randn(256 << 10)}, blocking=True)  # 1 MiB: within 3
        with caplog.at_level(logging.WARNING, logger="shardstream.client"):
            with pytest.raises(ResourceExhaustedError, match="quota") as raised:
                ck.save(2, {"w": torch.randn(1 << 20)}, blocking=True)  # 4 MiB more: over it
        # no wait clears a quota: the refusal carries no retry hint and is not retried
        assert raised.value.retry_after_s is None
        assert not [r for r in caplog.records if "retrying" in r.getMessage()], caplog.text
        chunks = {p.name for p in (root / "quota" / "chunks").rglob("*") if p.is_file()}
        assert chunks == {h for t in ck.manifest(1)["parts"][0]["tensors"].values() for h, _ in t["chunks"]}
        assert ck.steps() == [1]


def _stored(root: Path, job: str) -> set[str]:
    return {p.name for p in (root / job / "chunks").rglob("*") if p.is_file()}


def _named(ck: Checkpointer, step: int) -> set[str]:
    return {h for part in ck.manifest(step)["parts"] for t in part["tensors"].values() for h, _ in t["chunks"]}


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # no_dist=True, one process
def test_a_dcp_save_that_fails_keeps_nothing_of_it(limited: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """dcp.save through the fleet (Checkpointer.storage_writer) cleans up as Checkpointer.save does: a
    rank whose chunks go over the quota removes what it sent, and a commit that fails removes every
    rank's chunks of the save (those no committed step names) — a full root is not left full."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    server, root = limited
    with Checkpointer([server.target], job="dcp-quota", token=TOKEN, chunk_bytes=256 << 10) as ck:
        dcp.save({"w": torch.randn(256 << 10)}, storage_writer=ck.storage_writer(1), no_dist=True)  # 1 MiB of 3
        kept = _named(ck, 1)
        assert _stored(root, "dcp-quota") == kept
        with pytest.raises(CheckpointException, match="quota"):  # dcp's wrap of the rank's error
            dcp.save({"w": torch.randn(1 << 20)}, storage_writer=ck.storage_writer(2), no_dist=True)
        assert _stored(root, "dcp-quota") == kept and ck.steps() == [1]
        # chunks that fit, then a commit that fails: they go again
        def refused(*_: Any, **__: Any) -> None:
            raise ResourceExhaustedError("the commit failed (injected)")

        monkeypatch.setattr(ck._chunks, "commit", refused)
        with pytest.raises(CheckpointException, match="injected"):
            dcp.save({"w": torch.randn(128 << 10)}, storage_writer=ck.storage_writer(3), no_dist=True)
        assert _stored(root, "dcp-quota") == kept and ck.steps() == [1]


# --- 3. a full root -----------------------------------------------------------------------------------
@pytest.fixture()
def small_root(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A 6 MiB checkpoint root: a tmpfs where this machine lets the test mount one, else the
    injected full disk of tests/support/full_disk (ENOSPC at fsync once the root holds 6 MiB)."""
    root = tmp_path / "small"
    root.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(root)], capture_output=True).returncode == 0
    except OSError:  # no mount(8) here
        mounted = False
    env = {} if mounted else {
        "PYTHONPATH": os.pathsep.join([str(SUPPORT / "full_disk"), os.environ.get("PYTHONPATH", "")]),
        "SHARDSTREAM_TEST_DISK_BYTES": str(6 << 20),
        "SHARDSTREAM_TEST_DISK_ROOT": str(root),
    }  # fmt: skip
    try:
        yield root, env
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(root)], check=False)


def test_a_full_root_is_resource_exhausted_and_the_next_save_that_fits_succeeds(data_root: Path, small_root: Any) -> None:
    root, env = small_root
    with Servers(data_root) as servers:
        server = servers.start(extra_args=("--checkpoint-root", str(root)), env=env)
        with Checkpointer([server.target], job="full", chunk_bytes=512 << 10) as ck:
            with pytest.raises(ResourceExhaustedError, match="no space left"):
                ck.save(1, {"w": torch.randn(2 << 20)}, blocking=True)  # 8 MiB into 6
            left = [p for p in root.rglob("*") if p.is_file()]
            assert left == [], left  # its chunks removed, no temporary file
            ck.save(2, {"w": torch.arange(10.0)}, blocking=True)
            assert ck.steps() == [2] and torch.equal(ck.load("latest")["w"], torch.arange(10.0))


# --- 4. deduplication verifies --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def open_server(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    root = tmp_path_factory.mktemp("ckopen")
    with Servers(data_root) as servers:
        yield servers.start(metrics=True, extra_args=("--checkpoint-root", str(root))), root


def _flip(path: Path, at: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupt_chunk_is_not_reused_and_the_next_save_repairs_older_steps(open_server: Any) -> None:
    server, root = open_server
    job = "dedup-verify"
    state = {"frozen": torch.arange(100_000, dtype=torch.float32), "head": torch.zeros(10)}
    with Checkpointer([server.target], job=job, chunk_bytes=64 << 10) as ck:
        ck.save(1, state, blocking=True)
        frozen = next(t for t in ck.manifest(1)["parts"][0]["tensors"].values() if t["path"] == "frozen")
        h = frozen["chunks"][2][0]
        _flip(root / chunk_key(job, h))
        with pytest.raises(DataLossError):
            ck.load(1)
        state["head"].add_(1)
        second = ck.save(2, state, blocking=True)
        assert second.bytes_sent >= 64 << 10  # the corrupt chunk sent again
        assert torch.equal(ck.load(2)["frozen"], state["frozen"])
        assert torch.equal(ck.load(1)["frozen"], state["frozen"])  # the older step is whole again
    assert scrape(server)["shardstream_checkpoint_corrupt_chunks_total"] >= 1


# --- 5. damaged manifests -----------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run([sys.executable, "-m", "shardstream", "checkpoint", *args], capture_output=True, text=True, timeout=120)


def test_a_damaged_manifest_is_contained(open_server: Any) -> None:
    server, root = open_server
    job = "damaged"
    with Checkpointer([server.target], job=job) as ck:
        for step in (1, 2, 3):
            ck.save(step, {"w": torch.full((5,), float(step))}, blocking=True)
        path = root / manifest_key(job, 3)
        path.write_bytes(path.read_bytes()[:40])  # truncated
        assert ck.latest() == 2 and ck.steps() == [1, 2]
        assert torch.equal(ck.load("latest")["w"], torch.full((5,), 2.0))
        with pytest.raises(DataLossError, match="unreadable"):
            ck.load(3)
    listed = _cli("list", "--job", job, "--checkpoint-root", str(root))
    assert listed.returncode == 0 and "DAMAGED" in listed.stdout, listed
    shown = _cli("show", "--job", job, "--checkpoint-root", str(root))
    assert shown.returncode == 0 and f"{job}@2" in shown.stdout, shown
    gc = _cli("gc", "--job", job, "--keep", "1", "--checkpoint-root", str(root), "--json")
    assert gc.returncode == 0, gc
    report = json.loads(gc.stdout)
    assert (report["kept_steps"], report["removed_steps"], report["damaged_steps"]) == ([2], [1], [3])
    assert not path.exists()
    assert scrape(server)["shardstream_checkpoint_damaged_manifests_total"] >= 1


# --- 6. a missing chunk -----------------------------------------------------------------------------------
def test_a_missing_chunk_is_data_loss_naming_the_step_and_tensor(open_server: Any) -> None:
    server, root = open_server
    job = "missing-chunk"
    with Checkpointer([server.target], job=job) as ck:
        ck.save(4, {"model": {"bias": torch.ones(7)}}, blocking=True)
        h = ck.manifest(4)["parts"][0]["tensors"]["0"]["chunks"][0][0]
        (root / chunk_key(job, h)).unlink()
        with pytest.raises(DataLossError) as err:
            ck.load(4)
    assert f"{job}@4" in str(err.value) and "model/bias" in str(err.value) and "missing" in str(err.value)


# --- 7. follow() and a restarted server ----------------------------------------------------------------------
def test_follow_rides_out_its_only_server_restarting(data_root: Path, tmp_path: Path) -> None:
    with Servers(data_root) as servers:
        server = servers.start(extra_args=("--checkpoint-root", str(tmp_path / "ck")))
        seen: list[int] = []
        errors: list[BaseException] = []
        got = threading.Event()
        with Checkpointer([server.target], job="follow-restart") as writer, Checkpointer([server.target], job="follow-restart") as reader:
            writer.save(1, {"w": torch.zeros(3)}, blocking=True)
            follow = reader.follow(poll_s=0.01, timeout_s=120)

            def consume() -> None:
                try:
                    for step in follow:
                        seen.append(step)
                        got.set()
                        if step == 3:
                            return
                except BaseException as exc:  # noqa: BLE001 — handed to the test
                    errors.append(exc)
                    got.set()

            thread = threading.Thread(target=consume, daemon=True)
            thread.start()
            writer.save(2, {"w": torch.ones(3)}, blocking=True)
            assert got.wait(60) and not errors, errors
            server.kill()  # its only server: follow() looks and finds nothing there
            server.start()  # again, on the same ports
            writer.save(3, {"w": torch.ones(3)}, blocking=True)
            thread.join(120)
        assert not errors and seen == [2, 3], (seen, errors)


# --- 8. the wire: proto commands, and the previous release's JSON ----------------------------------------
# The exact bytes the previous release's client sent (json.dumps of its dicts) for a one-rank save of
# {"w": torch.tensor([1, 2, 3, 4], dtype=torch.uint8)} at step 1 and its load.
LEGACY_HASH = "9f64a747e1b97f131fabb6b447296c9b6f0201e79fb3c5356e6c77e89b6a806a"  # sha256 of bytes 1, 2, 3, 4
LEGACY_PUT = b'{"op": "chunks", "job": "legacy", "hashes": ["' + LEGACY_HASH.encode() + b'"]}'
LEGACY_HAS = b'{"job": "legacy", "hashes": ["' + LEGACY_HASH.encode() + b'"]}'
LEGACY_PART = (
    b'{"job": "legacy", "step": 1, "rank": 0, "part": {"kind": "shardstream.checkpoint.part", "format": 1, '
    b'"job": "legacy", "step": 1, "rank": 0, "world_size": 1, "save_id": "legacy-save-1", "created_s": 1700000000.0, '
    b'"tensors": {"0": {"path": "w", "kind": "torch", "dtype": "uint8", "shape": [4], "nbytes": 4, '
    b'"chunks": [["' + LEGACY_HASH.encode() + b'", 4]]}}, "objects": {"dict": [["w", {"tensor": "0"}]]}, '
    b'"loader": null}}'
)
LEGACY_COMMIT = b'{"job": "legacy", "step": 1, "world_size": 1, "save_id": "legacy-save-1"}'
LEGACY_STEPS = b'{"job": "legacy"}'
LEGACY_MANIFEST = b'{"job": "legacy", "step": "latest", "rank": 0, "world_size": 1}'
LEGACY_TICKET = b"shardstream.checkpoint.chunks\n" + LEGACY_HAS


def _answer(results: list[Any]) -> Any:
    return json.loads(results[0].body.to_pybytes())


def test_the_previous_releases_json_commands_still_work(limited: Any) -> None:
    server, _ = limited
    assert chunk_hash(bytes([1, 2, 3, 4])) == LEGACY_HASH
    with _flight(server) as client:
        assert _answer(_action(client, "checkpoint.has", LEGACY_HAS)) == {"present": []}
        writer, reader = client.do_put(flight.FlightDescriptor.for_command(LEGACY_PUT), CHUNK_SCHEMA, _options())
        writer.write_batch(_chunk_batch(bytes([1, 2, 3, 4])))
        writer.done_writing()
        assert json.loads(reader.read().to_pybytes()) == {"stored": 1, "present": 0, "bytes": 4}
        writer.close()
        assert _answer(_action(client, "checkpoint.put-part", LEGACY_PART)) == {}
        assert _answer(_action(client, "checkpoint.commit", LEGACY_COMMIT))["committed"] is True
        assert _answer(_action(client, "checkpoint.steps", LEGACY_STEPS)) == {"steps": [1]}
        manifest = _answer(_action(client, "checkpoint.manifest", LEGACY_MANIFEST))
        assert manifest["step"] == 1 and manifest["parts"][0]["tensors"]["0"]["chunks"] == [[LEGACY_HASH, 4]]
        table = client.do_get(flight.Ticket(LEGACY_TICKET), _options()).read_all()
        assert table.schema.equals(CHUNK_SCHEMA) and table.column("data").to_pylist() == [bytes([1, 2, 3, 4])]
    # what the old client saved, today's loads (and the other way round: the JSON manifest call above
    # reads a step today's client commits)
    with Checkpointer([server.target], job="legacy", token=TOKEN) as ck:
        assert torch.equal(ck.load("latest")["w"], torch.tensor([1, 2, 3, 4], dtype=torch.uint8))
        ck.save(2, {"w": torch.arange(3.0)}, blocking=True)
    with _flight(server) as client:
        assert _answer(_action(client, "checkpoint.steps", LEGACY_STEPS)) == {"steps": [1, 2]}


def test_the_client_sends_proto_commands(limited: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardstream.checkpoint_commands import encode_command
    from shardstream.client.checkpoint import transport

    server, _ = limited
    sent: list[tuple[str, bytes]] = []

    def recording(kind: str, body: Any) -> bytes:
        sent.append((kind, encode_command(kind, body)))
        return sent[-1][1]

    monkeypatch.setattr(transport, "encode_command", recording)
    with Checkpointer([server.target], job="proto-client", token=TOKEN) as ck:
        ck.save(1, {"w": torch.arange(5.0)}, blocking=True)
        assert torch.equal(ck.load(1)["w"], torch.arange(5.0)) and ck.steps() == [1]
    kinds = {kind for kind, _ in sent}
    assert {"chunks.put", "chunks.get", "checkpoint.has", "checkpoint.put-part", "checkpoint.commit"} <= kinds, kinds
    assert all(not raw.startswith(b"{") for _, raw in sent)


def test_bad_proto_commands_are_one_line_invalid_argument(limited: Any) -> None:
    from shardstream.checkpoint_commands import encode_command

    server, _ = limited
    steps = encode_command("checkpoint.steps", {"job": "proto-bad"})
    part = {"job": "proto-bad", "step": 1, "rank": 0, "part": {}}
    cases = {
        "garbage": ("checkpoint.steps", b"\xff\xff\xff\xff", "neither a CheckpointCommand"),
        "unknown field": ("checkpoint.steps", steps + b"\x78\x01", "does not define"),
        "unknown nested field": ("checkpoint.steps", b"\x42\x02\x78\x01" + steps, "does not define"),
        "another op": ("checkpoint.has", steps, "holds a steps command, not has"),
        "no op": ("checkpoint.steps", b"", "holds no command"),
        "bad utf-8": ("checkpoint.steps", b"\x0a\x02\xff\xfe\x42\x00", "neither a CheckpointCommand"),
        "no step": ("checkpoint.manifest", b"\x0a\x01x\x4a\x00", "names no step"),
        "deep part": ("checkpoint.put-part", encode_command("checkpoint.put-part", {**part, "part": {"a": _nested(100)}}), "nests deeper than 64"),
        "part not json": ("checkpoint.put-part", b"\x0a\x01x\x2a\x05\x08\x01\x1a\x01[", "must be a JSON object"),
        "rank over": ("checkpoint.put-part", encode_command("checkpoint.put-part", {**part, "rank": 1 << 21}), "rank"),
    }
    with _flight(server) as client:
        for name, (kind, body, words) in cases.items():
            err = _error(lambda: _action(client, kind, body))  # noqa: B023
            assert isinstance(err, InvalidArgumentError), (name, err)
            assert "\n" not in str(err) and "Traceback" not in str(err), (name, err)
            assert words in str(err), (name, err)
        get = b"shardstream.checkpoint.chunks\n" + steps
        err = _error(lambda: client.do_get(flight.Ticket(get), _options()).read_all())
        assert isinstance(err, InvalidArgumentError) and "not get_chunks" in str(err), err
        descriptor = flight.FlightDescriptor.for_command(b"\xff\xff")
        err = _error(lambda: client.do_put(descriptor, CHUNK_SCHEMA, _options())[1].read())
        assert isinstance(err, InvalidArgumentError) and "neither a CheckpointCommand" in str(err), err
        # and none of it is parsed before the caller is known
        for body in (b"\xff\xff", steps + b"\x78\x01"):
            err = _error(lambda: _action(client, "checkpoint.steps", body, None))  # noqa: B023
            assert isinstance(err, UnauthenticatedError), err


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value
