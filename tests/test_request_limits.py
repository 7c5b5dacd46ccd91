"""Admission without a server: every absurd ReadRequest field is INVALID_ARGUMENT naming the field and
its limit (request_limits.py), transforms may not ask for huge outputs per sample (pipeline.py), and
the stream accounting refuses streams over its limits with a retry hint (admission.py).

The same limits against a real server process, with random requests, stalled and frozen clients:
test_admission.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from shardstream.errors import (
    RETRY_PUSHBACK_KEY,
    InvalidArgumentError,
    ResourceExhaustedError,
    retry_pushback_s,
)
from shardstream.server.backends.roots import open_registry
from shardstream.server.read.plan import ReadPlanner
from shardstream.server.read.reader import new_row_group_cache
from shardstream.server.read.request_limits import MAX_PARAMS_JSON_DEPTH, RequestLimits, check_params_json
from shardstream.server.serving.admission import Admission, AdmissionLimits, peer_host
from shardstream.server.serving.reaper import _parse_peer, _proc_ip
from shardstream.v1 import shardstream_pb2 as pb

from .support import media
from .support.data import write_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("limits") / "root"
    write_dataset(root, "toy", 100, row_group_rows=20, shard_rows=50)
    write_dataset(root, "toy", 100, row_group_rows=20, shard_rows=50, start=1000)
    media.write_table(root, "imgs", media.blob_table("image", media.real_images()[:2]))
    media.write_table(root, "episodes", media.episodes_table(6))
    return root


def planner_for(root: Path, limits: RequestLimits | None = None) -> Iterator[ReadPlanner]:
    with open_registry(str(root)) as registry:
        yield ReadPlanner(registry, new_row_group_cache(16 << 20), limits)


@pytest.fixture
def planner(root: Path) -> Iterator[ReadPlanner]:
    yield from planner_for(root)


def request(dataset: str = "toy", transforms: list[dict[str, Any]] = (), **fields: Any) -> pb.ReadRequest:  # type: ignore[assignment]
    req = pb.ReadRequest(dataset=dataset, **{"world_size": 1, "batch_size": 4, **fields})
    for t in transforms:
        req.transforms.add(op=t["op"], params_json=json.dumps({k: v for k, v in t.items() if k != "op"}))
    return req


def mixture(block: int = 0, epoch_samples: int = 0, sources: int = 2, **fields: Any) -> pb.ReadRequest:
    req = request("", mixture_block=block, mixture_epoch_samples=epoch_samples, **fields)
    for i in range(sources):
        req.mixture.add(dataset=f"toy@{i % 2 + 1}", weight=1.0)
    return req


def nested(depth: int) -> str:
    return '{"op": "x", "a": ' + "[" * depth + "]" * depth + "}"


U64 = 2**64 - 1
U32 = 2**32 - 1


@pytest.mark.parametrize(
    ("req", "match"),
    [
        (request(batch_size=U32), r"batch_size must be at most 65536 \(this server's --max-batch-size\)"),
        (request(world_size=U32), "world_size must be at most 1048576"),
        (request(world_size=0), r"rank must be in \[0, world_size\)"),
        (request(step_stride=U32), "step_stride must be at most 65536"),
        (request(epoch=U64), "epoch must be at most 4294967295"),
        (request(start_offset=U64), "start_offset must be at most"),
        (request(first_step=U64), "first_step must be at most"),
        (request(num_steps=U64), "num_steps must be at most"),
        (request(shuffle=pb.Shuffle(mode="block", window=U32)), "shuffle.window must be at most 1048576"),
        (request(shuffle=pb.Shuffle(mode="x" * 5000)), "shuffle.mode is 5000 characters long"),
        (request(columns=["id"] * 1025), "columns must be at most 1024 names"),
        (request(columns=["c" * 2000]), r"columns\[0\] is 2000 characters long, over the limit of 1024"),
        (request(dataset="d" * 513), "dataset is 513 characters long, over the limit of 512"),
        (request(fingerprint="f" * 10_000), "fingerprint is 10000 characters long"),
        (request(on_error="s" * 2000), "on_error is 2000 characters long"),
        (mixture(block=U32), "mixture_block must be at most 1048576 samples"),
        (mixture(epoch_samples=U64), "mixture_epoch_samples must be at most 281474976710656"),
        (mixture(epoch_samples=2**40, epoch=2**31), r"\(epoch \+ 1\) \* mixture_epoch_samples must be at most"),
        (mixture(sources=257), "mixture must be at most 256 sources"),
        (request(transforms=[{"op": "text.tokenize"}] * 17), "transforms must be at most 16 per request"),
        (request(transforms=[{"op": "x" * 2000}]), r"transforms\[0\].op is 2000 characters long"),
    ],
)
def test_each_field_over_its_limit_is_refused_naming_it(
    planner: ReadPlanner, req: pb.ReadRequest, match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        planner.plan(req)


@pytest.mark.parametrize(
    ("params_json", "match"),
    [
        (nested(30_000), f"nested deeper than the limit of {MAX_PARAMS_JSON_DEPTH} levels"),
        (nested(100_000), "params_json is 200018 bytes"),  # the issue's: RecursionError, INTERNAL before
        ('{"column": "' + "x" * (70 << 10) + '"}', r"transforms\[0\] \(image.decode\): params_json is 71694 bytes, over the limit of 65536"),
        ('{"size": ' + "9" * 5000 + "}", "not valid JSON"),  # Python refuses ints of over 4,300 digits
        ('{"size": 1e999}', "must be"),  # inf
        ('{"size": NaN}', "must be"),
        ('{"size": [' + "1," * 3000 + "1]}", "must be"),
        ("[1, 2]", "must be a JSON object"),
        ("{", "not valid JSON"),
    ],
)
def test_bad_transform_parameters_are_refused(planner: ReadPlanner, params_json: str, match: str) -> None:
    req = request("imgs")
    req.transforms.add(op="image.decode", params_json=params_json)
    with pytest.raises(InvalidArgumentError, match=match) as err:
        planner.plan(req)
    assert len(str(err.value)) < 500  # a bad value is quoted, not echoed whole


def test_params_json_depth_counts_brackets_outside_strings_only() -> None:
    check_params_json("t", "[" * MAX_PARAMS_JSON_DEPTH + "]" * MAX_PARAMS_JSON_DEPTH)
    check_params_json("t", json.dumps({"a": "[" * 1000 + '\\"{' * 1000}))
    with pytest.raises(InvalidArgumentError, match="nested deeper"):
        check_params_json("t", "[" * (MAX_PARAMS_JSON_DEPTH + 1))


@pytest.mark.parametrize(
    ("dataset", "transforms", "what"),
    [
        ("imgs", [{"op": "image.decode", "size": [8192, 8192]}], "image: "),
        ("imgs", [{"op": "image.decode", "size": [1024, 1024], "normalize": {"mean": [0] * 3, "std": [1] * 3}}], ""),
        ("imgs", [{"op": "video.frames", "column": "image", "num_frames": 64, "size": [256, 256]}], ""),
        ("imgs", [{"op": "audio.decode", "column": "image", "sample_rate": 16000, "length": 1 << 20}], ""),
        ("toy", [{"op": "text.tokenize", "tokenizer": "bytes"}, {"op": "text.pack", "seq_len": 1 << 18}], ""),
        ("episodes", [{"op": "rl.windows", "window": 1 << 16}], ""),
    ],
)
def test_a_transform_output_over_the_limit_per_sample_is_refused(
    root: Path, dataset: str, transforms: list[dict[str, Any]], what: str
) -> None:
    for planner in planner_for(root, RequestLimits(max_sample_bytes=1 << 20)):
        op = transforms[-1]["op"]
        with pytest.raises(InvalidArgumentError, match=rf"{op}: its output is \d+ bytes per sample \({what}"):
            planner.plan(request(dataset, transforms))
        assert "1048576 bytes per sample (--max-sample-mib)" in str(
            pytest.raises(InvalidArgumentError, planner.plan, request(dataset, transforms)).value
        )


def test_the_default_sample_limit_refuses_an_8k_decode_of_a_tiny_image(planner: ReadPlanner) -> None:
    """The issue's 161-byte request: image.decode to 8192 x 8192 of an 8 x 8 PNG (768 MiB a message)."""
    big = [{"op": "image.decode", "size": [8192, 8192]}]
    with pytest.raises(InvalidArgumentError, match=r"201326592 bytes per sample .* limit of 67108864"):
        planner.plan(request("imgs", big))
    assert planner.plan(request("imgs", [{"op": "image.decode", "size": [224, 224]}])).pipeline


def test_the_largest_values_a_field_may_take_are_served(planner: ReadPlanner) -> None:
    plan = planner.plan(request(seed=U64, epoch=U32, shuffle=pb.Shuffle(mode="full"), batch_size=65_536))
    assert plan.layout.num_steps == 1
    assert planner.plan(mixture(block=1 << 20, epoch_samples=1 << 30, epoch=(1 << 32) - 1)).layout.num_steps


def test_configured_limits_and_the_message_cap(root: Path) -> None:
    for planner in planner_for(root, RequestLimits(max_batch_size=10, max_message_bytes=1 << 20)):
        with pytest.raises(InvalidArgumentError, match="batch_size must be at most 10"):
            planner.plan(request(batch_size=11))
        plan = planner.plan(request(batch_size=10, max_message_bytes=U64))
        assert (plan.max_message_bytes, plan.message_cap_bytes) == (1 << 20, 1 << 20)  # clamped
        assert planner.plan(request(max_message_bytes=1)).max_message_bytes == 1  # a target, kept


# --- stream accounting ----------------------------------------------------------------------------
def test_peer_host_drops_the_port() -> None:
    assert peer_host("ipv4:10.1.2.3:5678") == "ipv4:10.1.2.3"
    assert peer_host("ipv6:[::1]:5678") == "ipv6:[::1]"
    assert peer_host("ipv6:%5B::1%5D:5678") == "ipv6:%5B::1%5D"
    assert peer_host("unix:/tmp/s") == "unix:/tmp/s"
    assert _parse_peer("ipv6:%5B::1%5D:5678") == ("::1", 5678)
    assert _parse_peer("ipv4:127.0.0.1:80") == ("127.0.0.1", 80)
    assert _parse_peer("unix:/tmp/s") is None
    assert _proc_ip("0100007F") == "127.0.0.1"  # as /proc/net/tcp writes it
    assert _proc_ip("0000000000000000FFFF00000100007F") == "127.0.0.1"  # IPv4-mapped, tcp6


def refused(admission: Admission, peer: str) -> ResourceExhaustedError:
    with pytest.raises(ResourceExhaustedError) as err:
        admission.admit(peer)
    return err.value


def test_streams_are_refused_over_the_server_and_peer_limits() -> None:
    adm = Admission(AdmissionLimits(max_streams=4, max_streams_per_peer=2, retry_after_s=0.25))
    a1, a2 = adm.admit("ipv4:10.0.0.1:1000"), adm.admit("ipv4:10.0.0.1:1001")  # one host, two connections
    exc = refused(adm, "ipv4:10.0.0.1:1002")
    assert "2 Read streams in progress from ipv4:10.0.0.1" in str(exc) and "--max-streams-per-peer" in str(exc)
    assert exc.trailing_metadata() == ((RETRY_PUSHBACK_KEY, "250"),)
    b1, b2 = adm.admit("ipv4:10.0.0.2:1"), adm.admit("ipv6:[::1]:2")
    assert "4 Read streams in progress, this server's limit (--max-streams)" in str(refused(adm, "ipv4:10.0.0.3:1"))
    a1.close()
    a1.close()  # once only
    adm.admit("ipv4:10.0.0.1:1003")
    assert adm.streams == 4
    for t in (a2, b1, b2):
        t.close()
    assert adm.streams == 1


def test_held_bytes_spend_the_buffer_budget() -> None:
    adm = Admission(AdmissionLimits(buffer_bytes=1000))
    t = adm.admit("ipv4:10.0.0.1:1")
    t.hold(600)
    assert adm.has_room()
    t.hold(600)
    assert not adm.has_room()
    assert "hold 1200 bytes of messages, at its budget of 1000 (--stream-buffer-mib)" in str(refused(adm, "ipv4:b:1"))
    t.release(600)
    other = adm.admit("ipv4:10.0.0.2:1")
    t.close()  # gives back what it still held
    assert adm.buffered_bytes == 0 and adm.streams == 1
    other.close()


class _Error(grpc.RpcError):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def test_the_retry_hint_round_trips() -> None:
    exc = ResourceExhaustedError("busy", retry_after_s=1.5)
    assert retry_pushback_s(_Error(exc.trailing_metadata())) == 1.5
    assert retry_pushback_s(_Error(())) is None
    assert retry_pushback_s(_Error(((RETRY_PUSHBACK_KEY, "soon"),))) is None
    assert retry_pushback_s(grpc.RpcError()) is None
