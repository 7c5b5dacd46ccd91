"""What a client reads of an error (DESIGN §10): every kind of failure the registry, the storage and
the reader can produce, triggered through a real server, names the dataset version (and the shard)
and never a path of the server's root nor a Python exception's text — on a local root and on S3."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow.flight as flight
import pytest

from shardstream.errors import DataLossError, FlightStatus, NotFoundError
from shardstream.registry import Registry
from shardstream.server.backends.roots import open_registry, open_storage
from shardstream.server.local_fleet import LocalServer
from shardstream.server.policy.redact import client_message
from shardstream.storage import LocalStorage
from shardstream.v1 import shardstream_pb2 as pb

from .support.bad_registry import break_manifest, link_dataset
from .support.data import write_dataset

PYTHON_EXCEPTION = re.compile(r"\b[A-Z]\w*(Error|Exception|Invalid)\b|Errno|Traceback")

# (name of the case, dataset or Read request fields, expected code, texts the message must name)
GET_CASES = [
    ("unknown dataset", "nope", grpc.StatusCode.NOT_FOUND, ["nope"]),
    ("unknown version", "alpha@9", grpc.StatusCode.NOT_FOUND, ["alpha", "9"]),
    ("unknown tag", "alpha@nope", grpc.StatusCode.NOT_FOUND, ["alpha", "nope"]),
    ("malformed tag", "alpha@mangled", grpc.StatusCode.DATA_LOSS, ["alpha@mangled"]),
    ("traversal", "../etc", grpc.StatusCode.INVALID_ARGUMENT, []),
    ("truncated manifest", "gamma", grpc.StatusCode.DATA_LOSS, ["gamma@2"]),
    ("manifest out of the root", "eps@1", grpc.StatusCode.DATA_LOSS, ["eps@1"]),
    ("symlinked directory", "delta", grpc.StatusCode.DATA_LOSS, ["delta"]),
]
READ_CASES = [
    ("missing shard", {"dataset": "missing@1"}, grpc.StatusCode.DATA_LOSS, ["missing@1", "part-00000"]),
    ("truncated shard", {"dataset": "short@1"}, grpc.StatusCode.DATA_LOSS, ["short@1", "part-00000"]),
    ("garbage shard", {"dataset": "junk@1"}, grpc.StatusCode.DATA_LOSS, ["junk@1", "part-00000"]),
    ("shard out of the root", {"dataset": "away@1"}, grpc.StatusCode.DATA_LOSS, ["away@1", "part-00000"]),
    (
        "unknown column",
        {"dataset": "alpha@1", "columns": ["nope"]},
        grpc.StatusCode.INVALID_ARGUMENT,
        ["nope"],
    ),
    (
        "other fingerprint",
        {"dataset": "alpha@1", "fingerprint": "0" * 64},
        grpc.StatusCode.FAILED_PRECONDITION,
        [],
    ),
    ("bad manifest", {"dataset": "gamma@2"}, grpc.StatusCode.DATA_LOSS, ["gamma@2"]),
    ("unknown dataset", {"dataset": "nope@1"}, grpc.StatusCode.NOT_FOUND, ["nope"]),
]


def local_root(base: Path) -> Path:
    root = base / "root"
    for name in ("alpha", "alpha", "gamma", "gamma", "eps", "missing", "short", "junk", "away"):
        write_dataset(root, name, 120, shard_rows=60)
    (root / "alpha" / "tags").mkdir()
    (root / "alpha" / "tags" / "mangled").write_text("not a number\n")
    break_manifest(root, "gamma", 2, "truncated")
    break_manifest(root, "eps", 1, "link_outside")
    outside = base / "outside"
    write_dataset(outside, "delta", 10)
    link_dataset(root, "delta", outside / "delta")
    reg = Registry(root)
    shard = {n: root / n / reg.resolve(n).shards[0].uri for n in ("missing", "short", "junk")}
    shard["missing"].unlink()
    shard["short"].write_bytes(shard["short"].read_bytes()[:-100])
    shard["junk"].write_bytes(b"\x00" * shard["junk"].stat().st_size)
    away = root / "away" / reg.resolve("away").shards[0].uri
    (base / "away.parquet").write_bytes(away.read_bytes())
    away.unlink()
    away.symlink_to(base / "away.parquet")
    return root


def read_request(**fields: object) -> pb.ReadRequest:
    return pb.ReadRequest(world_size=1, batch_size=16, num_steps=2, **fields)  # type: ignore[arg-type]


def errors_of(server: LocalServer) -> Iterator[tuple[str, grpc.StatusCode, str, list[str]]]:
    """(case, code, details, what it must name) of every case, through `server`: GetDataset on its
    gRPC port, Read on its Flight data plane (the details a plain Flight client reads are checked too)."""
    with grpc.insecure_channel(server.target) as ch:
        get = ch.unary_unary(
            "/shardstream.v1.ShardStream/GetDataset",
            request_serializer=pb.GetDatasetRequest.SerializeToString,
            response_deserializer=pb.DatasetInfo.FromString,
        )
        for case, dataset, code, named in GET_CASES:
            with pytest.raises(grpc.RpcError) as err:
                get(pb.GetDatasetRequest(dataset=dataset), timeout=30)
            assert err.value.code() == code, (case, err.value.details())
            yield case, code, err.value.details(), named
    client = flight.connect(f"grpc://127.0.0.1:{server.data_port}")
    try:
        for case, fields, code, named in READ_CASES:
            with pytest.raises(flight.FlightError) as ferr:
                client.do_get(flight.Ticket(read_request(**fields).SerializeToString())).read_all()
            status = FlightStatus.of(ferr.value)
            assert status.code() == code, (case, status.details())
            yield case, code, status.details(), named
            server_text = str(ferr.value).split(". Detail: ")[0]  # the rest is pyarrow's own context
            assert server_text.startswith(code.name), (case, server_text)
            yield f"{case} (as Flight says it)", code, server_text, []
    finally:
        client.close()


def assert_safe(details: str, case: str, forbidden: list[str]) -> None:
    for text in forbidden:
        assert text not in details, (case, details)
    assert PYTHON_EXCEPTION.search(details) is None, (case, details)


def test_no_client_facing_error_names_a_server_path_or_an_exception(tmp_path: Path) -> None:
    root = local_root(tmp_path)
    forbidden = [str(tmp_path), str(tmp_path.resolve()), "/tmp/", "pytest-of"]
    seen = 0
    with LocalServer(root) as server:
        for case, _, details, named in errors_of(server):
            assert_safe(details, case, forbidden)
            for text in named:
                assert text in details, (case, details)
            seen += 1
    assert seen == len(GET_CASES) + 2 * len(READ_CASES)


def test_on_s3_no_error_names_the_bucket_or_the_endpoint(
    s3_root: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    local = tmp_path / "local"
    write_dataset(local, "web", 120, shard_rows=60)
    write_dataset(local, "cut", 120, shard_rows=60)
    with open_storage(s3_root) as st:
        for p in sorted(local.rglob("*")):
            if p.is_file():
                st.put_file(p.relative_to(local).as_posix(), p)
        st.put("web/manifests/2.json", b'{"format": 1, "name": "web", "vers')  # cut short
    with open_registry(s3_root) as reg:
        reg.storage.delete(f"cut/{reg.resolve('cut@1').shards[0].uri}")
    endpoint = s3_env["AWS_ENDPOINT_URL"]
    forbidden = [s3_root.rstrip("/"), endpoint, endpoint.split("//")[1]]
    with LocalServer(s3_root) as server, grpc.insecure_channel(server.target) as ch:
        get = ch.unary_unary(
            "/shardstream.v1.ShardStream/GetDataset",
            request_serializer=pb.GetDatasetRequest.SerializeToString,
            response_deserializer=pb.DatasetInfo.FromString,
        )
        assert get(pb.GetDatasetRequest(dataset="web@1"), timeout=30).num_rows == 120
        for dataset, code, named in (
            ("web", grpc.StatusCode.DATA_LOSS, "web@2"),
            ("nope", grpc.StatusCode.NOT_FOUND, "nope"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                get(pb.GetDatasetRequest(dataset=dataset), timeout=30)
            assert err.value.code() == code and named in err.value.details(), err.value.details()
            assert_safe(err.value.details(), dataset, forbidden)
        client = flight.connect(f"grpc://127.0.0.1:{server.data_port}")
        with pytest.raises(flight.FlightError) as ferr:
            client.do_get(flight.Ticket(read_request(dataset="cut@1").SerializeToString())).read_all()
        client.close()
        status = FlightStatus.of(ferr.value)
        assert status.code() == grpc.StatusCode.DATA_LOSS, status.details()
        assert "cut@1" in status.details() and "part-00000" in status.details()
        assert_safe(status.details(), "missing object", forbidden)
        assert_safe(str(ferr.value).split(". Detail: ")[0], "missing object (as Flight says it)", forbidden)


def test_client_message_cuts_the_root_and_hides_unexpected_errors(tmp_path: Path) -> None:
    st = LocalStorage(tmp_path / "root")
    where = tmp_path / "root" / "toy" / "data" / "x.parquet"
    msg = client_message(NotFoundError(f"{where}: no such file"), st)
    assert msg == "toy/data/x.parquet: no such file"
    msg = client_message(
        DataLossError(f"path 'x' leads outside the root {tmp_path / 'root'} (a symlink?)"), st
    )
    assert str(tmp_path) not in msg and "the server's root" in msg
    msg = client_message(DataLossError("toy@1: cache file /var/cache/shardstream/ab.arrow is bad"), st)
    assert msg == "toy@1: cache file <path> is bad"
    assert client_message(KeyError("/secret/path"), st) == "internal error (the server's log has the details)"
