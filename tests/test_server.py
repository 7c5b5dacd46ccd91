"""Server process behaviour: health, reflection, metrics, drain on SIGTERM, failover under a kill."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from shardstream.client import Loader
from shardstream.server.local_fleet import LocalServer
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import N_ROWS, write_dataset
from .support.servers import rpc_count, scrape, wait_for


def list_services(target: str) -> set[str]:
    with grpc.insecure_channel(target) as ch:
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        return {s.name for r in responses for s in r.list_services_response.service}


def test_health_and_reflection_only_with_the_flag(endpoints: list[str], server_factory) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(endpoints[0]) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "shardstream.v1.ShardStream"):
            resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as exc:
        list_services(endpoints[0])  # off by default: it lists the services to anyone who connects
    assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED
    names = list_services(server_factory(extra_args=("--reflection",)).target)
    assert {"shardstream.v1.ShardStream", "grpc.health.v1.Health"} <= names


def test_get_and_list_datasets(endpoints: list[str]) -> None:
    with grpc.insecure_channel(endpoints[0]) as ch:
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
        info = get(pb.GetDatasetRequest(dataset="toy"), timeout=5)
        assert (info.name, info.version, info.num_rows) == ("toy", 2, N_ROWS)
        assert [f.name for f in info.fields] == ["id", "x", "label", "text"]
        assert get(pb.GetDatasetRequest(dataset="toy@1"), timeout=5).fingerprint != info.fingerprint
        listed = {(d.name, d.version) for d in lst(pb.ListDatasetsRequest(), timeout=5).datasets}
        assert listed == {("toy", 2), ("tiny", 1)}
        with pytest.raises(grpc.RpcError) as err:
            get(pb.GetDatasetRequest(dataset="toy@5"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_metrics_count_streams_batches_bytes_and_errors(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(metrics=True)
    before = scrape(server)
    with Loader([server.target], "toy@1", batch_size=100) as ld:
        steps = sum(1 for _ in ld)
    with Loader([server.target], "nope", batch_size=1) as ld, pytest.raises(LookupError):
        iter(ld)
    # A Loader stops reading at its epoch's last step, before the stream's end: the server counts
    # the stream's last messages as its send loop ends, which may come after the client is done
    wait_for(lambda: scrape(server)["shardstream_streams_active"] == 0, "the stream to end")
    after = scrape(server)
    assert steps == 11
    assert after["shardstream_batches_sent_total"] - before.get("shardstream_batches_sent_total", 0) == steps
    assert after["shardstream_rows_sent_total"] == N_ROWS
    assert after["shardstream_bytes_sent_total"] > 0
    assert rpc_count(after, "Read") == 1
    assert rpc_count(after, "GetDataset", "NotFound") == 1
    assert rpc_count(after, "Read", "DataLoss") == 0  # exported as 0
    assert after['shardstream_rows_sent_total{dataset="toy"}'] == N_ROWS  # the dataset's name, no version
    assert after["shardstream_streams_active"] == 0
    assert after["shardstream_cache_misses_total"] > 0


def test_sigterm_drains_in_flight_streams_and_exits_zero(server_factory) -> None:  # type: ignore[no-untyped-def]
    from shardstream.errors import UnavailableError

    server = server_factory()
    with Loader([server.target], "toy@1", batch_size=7, prefetch=1, max_retries=1) as ld:
        it = iter(ld)
        got = [next(it)["id"]]
        server.terminate()  # drain: the stream in flight may finish within the grace period
        got += [b["id"] for b in it]
    assert server.proc is not None and server.proc.wait(timeout=30) == 0
    assert sorted(np.concatenate(got).tolist()) == list(range(N_ROWS))
    with Loader([server.target], "toy@1", batch_size=7, timeout_s=2) as ld:
        with pytest.raises(UnavailableError):
            iter(ld)


def test_failover_when_a_server_is_killed_mid_stream(server_factory) -> None:  # type: ignore[no-untyped-def]
    a, b = server_factory(), server_factory()
    with Loader([a.target, b.target], "toy@1", batch_size=5, prefetch=2, max_message_bytes=1, seed=3) as ld:
        it = iter(ld)
        got = [next(it)["id"] for _ in range(10)]
        a.kill()  # a crash, no drain; the loader streams from a first (rank 0 -> endpoint 0)
        got += [x["id"] for x in it]
    ids = np.concatenate(got).tolist()
    assert sorted(ids) == list(range(N_ROWS)) and len(ids) == N_ROWS
    with Loader([b.target], "toy@1", batch_size=5, seed=3) as ref:
        assert ids == np.concatenate([x["id"] for x in ref]).tolist()


def test_concurrent_streams_from_many_threads(endpoints: list[str]) -> None:
    results: dict[int, list[int]] = {}

    def rank(r: int) -> None:
        with Loader(endpoints, "toy@1", batch_size=13, rank=r, world_size=6, seed=4) as ld:
            results[r] = np.concatenate([b["id"] for b in ld]).tolist()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(i for ids in results.values() for i in ids) == list(range(N_ROWS))


def test_port_in_use_is_a_clear_error(fleet: list[LocalServer], data_root: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardstream",
            "serve",
            "--root",
            str(data_root),
            "--port",
            str(fleet[0].port),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "cannot listen" in r.stderr and "Traceback" not in r.stderr


def test_missing_root_is_a_clear_error(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "shardstream", "serve", "--root", str(tmp_path / "nope"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "no such directory" in r.stderr and "Traceback" not in r.stderr


def test_corrupt_shard_is_data_loss_naming_the_shard(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    from shardstream.errors import DataLossError

    root = tmp_path / "root"
    m = write_dataset(root, "fragile", 300, row_group_rows=50, shard_rows=100)
    victim = root / "fragile" / m.shards[1].uri
    victim.write_bytes(b"garbage" * 100)
    server = server_factory(root)
    with Loader([server.target], "fragile", batch_size=10, shuffle=False) as ld:
        with pytest.raises(DataLossError, match=m.shards[1].uri):
            for _ in ld:
                pass


def test_dns_endpoint_reaches_the_fleet(endpoints: list[str]) -> None:
    port = endpoints[0].rsplit(":", 1)[1]
    with Loader([f"dns:///localhost:{port}"], "toy@1", batch_size=100) as ld:
        assert sum(len(b["id"]) for b in ld) == N_ROWS


def test_repeated_kill_9_of_servers_loses_and_repeats_nothing(server_factory) -> None:  # type: ignore[no-untyped-def]
    """4 ranks, 2 epochs, 3 servers; every 25 consumed steps one server is SIGKILLed and restarted
    while the ranks wait (as a training step would), so every kill lands mid-stream."""
    servers = [server_factory() for _ in range(3)]
    targets = [s.target for s in servers]
    world, batch, every = 4, 8, 25

    def run(faults: bool) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {r: [] for r in range(world)}
        cond = threading.Condition()
        consumed = [0]
        kills = [0]
        errors: list[BaseException] = []

        def rank(r: int) -> None:
            try:
                with Loader(
                    targets,
                    "toy@1",
                    batch_size=batch,
                    rank=r,
                    world_size=world,
                    epochs=2,
                    seed=8,
                    prefetch=2,
                    max_message_bytes=1,
                    max_retries=20,
                ) as ld:
                    for b in ld:
                        out[r].extend(b["id"].tolist())
                        with cond:
                            consumed[0] += 1
                            cond.notify_all()
                            if faults:
                                cond.wait_for(lambda: kills[0] >= consumed[0] // every)
            except BaseException as exc:  # noqa: BLE001 — reported below
                errors.append(exc)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        victim = 0
        while faults and any(t.is_alive() for t in threads):
            with cond:
                due = cond.wait_for(lambda: consumed[0] >= every * (kills[0] + 1), timeout=1)
            if due:
                servers[victim].kill()
                servers[victim].start()  # same port
                victim = (victim + 1) % len(servers)
                with cond:
                    kills[0] += 1
                    cond.notify_all()
        for t in threads:
            t.join()
        assert not errors, errors
        assert not faults or kills[0] >= 8, kills
        return out

    reference = run(faults=False)
    faulty = run(faults=True)
    assert faulty == reference  # per-rank order identical to the fault-free run
    everything = sorted(i for ids in faulty.values() for i in ids)
    assert everything == sorted(list(range(N_ROWS)) * 2)  # 2 epochs: each sample exactly twice
