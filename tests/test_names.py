"""Dataset names, tags and versions are parsed strictly and in one place (DESIGN §10, shardstream/names.py):
ASCII digits only, bounded lengths, full matches; every other input is InvalidArgumentError in one
line — from the parser, from real servers on both planes (never INTERNAL), from a Loader at
construction and from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pyarrow.flight as flight
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.client import Loader
from shardstream.errors import DataLossError, FlightStatus, InvalidArgumentError
from shardstream.names import MAX_NAME_CHARS, MAX_VERSION, DatasetRef, parse_version, validate_name
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.v1 import shardstream_pb2 as pb

from .support.servers import rpc_count, scrape

# Each of these once reached int() (INTERNAL, or another version), a regex's `$` or no bound at all.
BAD_REFS = (
    "toy@²",  # str.isdigit() is True, int() raises
    "toy@١",  # Arabic-Indic one: int() gives 1
    "toy@" + "1" * 5000,  # a version no uint32 holds
    "toy\n",  # `$` matches before a final newline
    "toy@1\n",
    "toy@007",  # not the canonical form: toy@7
    f"toy@{MAX_VERSION + 1}",
    "toy@0",
    "t" * (MAX_NAME_CHARS + 1),
)

NAME_CHARS = "aZ09._-@\n ²١⁷٧"
near_refs = st.builds(
    lambda name, sep, rest: name + sep + rest,
    st.text(alphabet=NAME_CHARS, max_size=MAX_NAME_CHARS + 4),
    st.sampled_from(["", "@"]),
    st.one_of(
        st.text(alphabet="0123456789", max_size=12),
        st.text(alphabet=st.characters(categories=["Nd", "No"]), max_size=3),
        st.text(alphabet=NAME_CHARS, max_size=8),
    ),
)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.text(), near_refs))
def test_any_text_is_a_ref_that_round_trips_or_one_invalid_argument_line(text: str) -> None:
    try:
        ref = DatasetRef.parse(text)
    except InvalidArgumentError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
        return
    assert str(ref) == text and DatasetRef.parse(str(ref)) == ref
    assert validate_name(ref.name) == ref.name and ref.name.isascii() and len(ref.name) <= MAX_NAME_CHARS
    if ref.version is not None:
        assert ref.tag is None and 1 <= ref.version <= MAX_VERSION
        assert parse_version(text.partition("@")[2]) == ref.version
    elif ref.tag is not None:
        assert validate_name(ref.tag, "tag") == ref.tag and not ref.tag.isdigit()


@settings(max_examples=500, deadline=None)
@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_versions_are_the_uint32_range_written_canonically(n: int) -> None:
    text = str(n)
    if 1 <= n <= MAX_VERSION:
        assert parse_version(text) == n and str(DatasetRef.parse(f"a@{text}")) == f"a@{n}"
    else:
        with pytest.raises(InvalidArgumentError):
            DatasetRef.parse(f"a@{text}")


@pytest.mark.parametrize("ref", BAD_REFS, ids=repr)
def test_bad_refs_are_invalid_argument(ref: str) -> None:
    with pytest.raises(InvalidArgumentError):
        DatasetRef.parse(ref)


def test_bad_refs_are_invalid_argument_on_both_planes_never_internal(fleet: list[LocalServer]) -> None:
    server = fleet[0]
    client = flight.connect(f"grpc://127.0.0.1:{server.info()['data_port']}")
    try:
        with grpc.insecure_channel(server.target) as ch:
            get = ch.unary_unary(
                "/shardstream.v1.ShardStream/GetDataset",
                request_serializer=pb.GetDatasetRequest.SerializeToString,
                response_deserializer=pb.DatasetInfo.FromString,
            )
            assert get(pb.GetDatasetRequest(dataset="toy@1"), timeout=30).version == 1
            for ref in BAD_REFS:
                with pytest.raises(grpc.RpcError) as info:
                    get(pb.GetDatasetRequest(dataset=ref), timeout=30)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (ref, info.value.details())
                for request in (
                    pb.ReadRequest(dataset=ref, batch_size=4, world_size=1),
                    pb.ReadRequest(
                        mixture=[pb.MixtureSource(dataset="toy@1", weight=1), pb.MixtureSource(dataset=ref, weight=1)],
                        batch_size=4,
                        world_size=1,
                    ),
                ):
                    with pytest.raises(flight.FlightError) as flight_info:
                        client.do_get(flight.Ticket(request.SerializeToString())).read_all()
                    status = FlightStatus.of(flight_info.value)
                    assert status.code() == grpc.StatusCode.INVALID_ARGUMENT, (ref, status.details())
    finally:
        client.close()
    m = scrape(server)
    assert rpc_count(m, "GetDataset", "Internal") == 0 and rpc_count(m, "Read", "Internal") == 0


def test_a_loader_refuses_a_bad_ref_at_construction(endpoints: list[str]) -> None:
    for ref in BAD_REFS:
        with pytest.raises(InvalidArgumentError, match="dataset"):
            Loader(endpoints, ref, batch_size=4)
        with pytest.raises(InvalidArgumentError):
            Loader(endpoints, {"toy@1": 1.0, ref: 1.0}, batch_size=4)


def test_ingest_refuses_a_name_with_a_trailing_newline_in_one_line(tmp_path: Path) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text('{"id": 1}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDSTREAM_")}
    p = subprocess.run(
        [sys.executable, "-m", "shardstream", "ingest", str(src), "--name", "toy\n", "--root", str(tmp_path / "r"), "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode != 0
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("shardstream: error: invalid dataset name 'toy\\n'")
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*.json"))


def test_the_registry_reads_only_canonical_versions_from_file_names_and_tags(data_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "toy" / "manifests").mkdir(parents=True)
    (root / "toy" / "tags").mkdir()
    manifest = (data_root / "toy" / "manifests" / "1.json").read_bytes()
    for stem in ("1", "01", "١", "²", "1 "):
        (root / "toy" / "manifests" / f"{stem}.json").write_bytes(manifest)
    for tag, text in (("good", "1\n"), ("arabic", "١\n"), ("super", "²\n"), ("huge", "9" * 5000)):
        (root / "toy" / "tags" / tag).write_text(text)
    with Registry(root) as reg:
        assert reg.versions("toy") == [1]
        assert reg.tags("toy") == {"good": 1}
        assert reg.resolve("toy@good").version == 1
        for tag in ("arabic", "super", "huge"):
            with pytest.raises(DataLossError, match=f"toy@{tag} is malformed"):
                reg.resolve(f"toy@{tag}")


@pytest.mark.parametrize("job", ["run-1\n", "run-1\r\n", "\nrun-1", "run\n-1"])
def test_a_job_name_with_a_newline_is_refused(job: str) -> None:
    from shardstream.client.cursors.records import validate_job

    assert validate_job("run-1") == "run-1"
    with pytest.raises(InvalidArgumentError, match="invalid job name"):
        validate_job(job)


@pytest.mark.parametrize("pattern", ["web\n", "web@3\n", "web@٣"])
def test_an_auth_pattern_with_a_newline_or_a_non_ascii_digit_is_refused(pattern: str) -> None:
    import yaml

    from shardstream.server.policy.auth import load_principals

    entry = {"name": "p", "token_sha256": "0" * 64, "datasets": [pattern]}
    with pytest.raises(InvalidArgumentError, match="bad dataset pattern"):
        load_principals(yaml.safe_dump({"principals": [entry]}))
    entry["datasets"] = ["web@3"]
    assert load_principals(yaml.safe_dump({"principals": [entry]}))[0].patterns == ("web@3",)
