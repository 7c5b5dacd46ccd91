"""Untrusted input against a real server: random bytes and random well-typed requests (hypothesis).

GetDataset and ListDatasets (gRPC) and Read (a Flight DoGet) are called on one `shardstream serve --auth` process over a small
registry, as any client on the network could: raw bytes through a generic channel (identity
serializers: whatever protobuf makes of them, or not), and requests built field by field from
absurd to plausible values, with a known token, an unknown one, or none. Every answer must be a
status the server chose (never INTERNAL or UNKNOWN: a crash or an unmapped error), the server must
stay up, and no error text may echo more than a short excerpt of any string the request carried
(`shardstream.errors.excerpt`). Over 2,000 cases in all.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pyarrow.flight as flight
import pytest
import yaml
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shardstream.errors import EXCERPT_CHARS, FlightStatus
from shardstream.server.policy.auth import token_sha256
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import write_dataset
from .support.servers import Servers

TOKEN = "fuzz-token-0123456789"
SERVICE = "/shardstream.v1.ShardStream/"
METHODS = {"GetDataset": pb.GetDatasetRequest, "ListDatasets": pb.ListDatasetsRequest, "Read": pb.ReadRequest}
CHOSEN = {  # codes the server sends on purpose
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.OUT_OF_RANGE,
}
ECHO_LIMIT = EXCERPT_CHARS + 2  # the longest run of a caller's string an error may repeat (quotes)


def fuzz(examples: int) -> Any:
    return settings(
        max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("fuzz")
    root = base / "root"
    write_dataset(root, "toy", 120, row_group_rows=40, shard_rows=60)
    write_dataset(root, "secret", 30)
    auth = base / "auth.yaml"
    auth.write_text(
        yaml.safe_dump(
            {
                "principals": [
                    {"name": "fuzzer", "token_sha256": token_sha256(TOKEN), "datasets": ["toy*", "t?y@1"]}
                ]
            }
        )
    )
    log = base / "server.log"
    with Servers(root) as servers:
        s = servers.start(extra_args=("--auth", str(auth)), log_path=log)
        s.log_file = log
        yield s
        assert s.proc is not None and s.proc.poll() is None, "the server died"
        text = log.read_text()
        assert "failed unexpectedly" not in text and "Traceback" not in text, text[-5000:]


@dataclass
class Wire:
    """The fuzz server's two ports: the gRPC channel (control plane) and a Flight client (Read)."""

    grpc: grpc.Channel
    flight: flight.FlightClient

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self.grpc.unary_unary(*args, **kwargs)


@pytest.fixture(scope="module")
def channel(server: Any) -> Iterator[Wire]:
    with grpc.insecure_channel(server.target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        client = flight.connect(f"grpc://127.0.0.1:{server.data_port}")
        try:
            yield Wire(ch, client)
        finally:
            client.close()


def strings_of(message: Message) -> list[str]:
    """Every string a request carries, nested messages included."""
    out = []
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        for v in values:
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, Message):
                out += strings_of(v)
    return out


def echoes(details: str, text: str) -> bool:
    """Whether `details` repeats more than ECHO_LIMIT characters of `text` (as is, or as repr shows it)."""
    for form in (text, repr(text)[1:-1]):
        if len(form) > ECHO_LIMIT and any(
            form[i : i + ECHO_LIMIT + 1] in details for i in range(len(form) - ECHO_LIMIT)
        ):
            return True
    return False


def call(
    channel: Wire, method: str, payload: bytes, metadata: tuple[tuple[str, str], ...]
) -> tuple[grpc.StatusCode, str]:
    """Send raw request bytes; (status code, details) — drains a Read stream (a Flight DoGet with
    the bytes as ticket) of a few messages at most. A Read's details are what the client reads back
    and what a plain Flight client reads (the server's text), joined."""
    if method == "Read":
        headers = [(k.encode(), v.encode("utf-8", "replace")) for k, v in metadata]
        options = flight.FlightCallOptions(timeout=30, headers=headers)
        try:
            reader = channel.flight.do_get(flight.Ticket(payload), options)
            for i, _ in enumerate(reader):
                if i >= 3:
                    reader.cancel()
                    break
            return grpc.StatusCode.OK, ""
        except flight.FlightError as exc:
            status = FlightStatus.of(exc)
            if status.code() == grpc.StatusCode.CANCELLED:
                return grpc.StatusCode.OK, ""
            return status.code(), f"{status.details()}\n{str(exc).split('. Detail: ')[0]}"
    try:
        channel.grpc.unary_unary(SERVICE + method)(payload, timeout=30, metadata=metadata)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.CANCELLED:
            return grpc.StatusCode.OK, ""
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def check(code: grpc.StatusCode, details: str, strings: list[str]) -> None:
    event(code.name)  # the mix of answers: --hypothesis-show-statistics
    assert code in CHOSEN, (code, details)
    for s in strings:
        assert not echoes(details, s), (details, s[:200])
    assert not re.search(r"(^|[\s'\"(])/(tmp|home|work|var)/", details), details  # no server path


def parsed_strings(method: str, raw: bytes) -> list[str]:
    try:
        return strings_of(METHODS[method].FromString(raw))
    except (DecodeError, UnicodeDecodeError, ValueError):
        return []


tokens = st.sampled_from([TOKEN] * 8 + ["", "nope", "x" * 300, "Bearer", TOKEN + " extra"])


def auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


raws = st.binary(max_size=600) | st.builds(
    lambda r: r.SerializeToString(), st.builds(pb.ReadRequest, dataset=st.text(max_size=300))
)


@fuzz(700)  # x 3 methods
@given(raw=raws, token=tokens)
def test_random_bytes_to_every_method(channel: Wire, raw: bytes, token: str) -> None:
    for method in METHODS:
        code, details = call(channel, method, raw, auth(token))
        check(code, details, parsed_strings(method, raw))


names = st.one_of(
    st.sampled_from(
        ["toy", "toy@1", "toy@2", "toy@latest", "secret", "secret@1", "tay@1", "nope", "", "@", "toy@0"]
    ),
    st.text(max_size=80),
    st.text(alphabet="abcdefghij@-_.", min_size=50, max_size=600),
    st.builds(lambda n: "toy" + "x" * n, st.integers(40, 600)),
    st.builds(lambda n: "t" * n + "@1", st.integers(120, 140)),
)
texts = st.one_of(
    st.sampled_from(["", "id", "x", "text", "label", "none", "block", "full", "skip", "fail"]),
    st.text(max_size=120),
)
u64 = st.one_of(
    st.integers(0, 70), st.sampled_from([2**31, 2**32 - 1, 2**62, 2**64 - 1]), st.integers(0, 2**64 - 1)
)
u32 = st.one_of(st.integers(0, 70), st.sampled_from([2**31, 2**32 - 1]), st.integers(0, 2**32 - 1))


WILD: dict[str, st.SearchStrategy[Any]] = {  # per field: values from absurd to malformed
    "dataset": names,
    "fingerprint": st.sampled_from(["", "abc"]) | st.text(max_size=100),
    "seed": u64,
    "epoch": u32,
    "shuffle": st.builds(pb.Shuffle, mode=texts, window=u32),
    "start_offset": u64,
    "rank": st.integers(0, 2**32 - 1),
    "world_size": st.sampled_from([0, 1, 3, 2**20 + 1]) | u32,
    "batch_size": st.sampled_from([0, 1, 10**6]) | u32,
    "first_step": u64,
    "num_steps": u64,
    "columns": st.lists(texts, max_size=3),
    "max_message_bytes": u64,
    "step_stride": u32,
    "on_error": texts,
}


@st.composite
def read_requests(draw: st.DrawFn) -> pb.ReadRequest:
    """A plausible Read of the toy dataset with up to four fields (or its transforms, or its mixture)
    replaced by wild values: enough of them get past the limits to be planned and streamed."""
    world = draw(st.integers(1, 3))
    req = pb.ReadRequest(
        dataset=draw(st.sampled_from(["toy@1", "toy", "toy@latest", "tay@1"])),
        seed=draw(st.integers(0, 9)),
        epoch=draw(st.integers(0, 2)),
        shuffle=pb.Shuffle(mode=draw(st.sampled_from(["none", "block", "full"]))),
        rank=draw(st.integers(0, world - 1)),
        world_size=world,
        batch_size=draw(st.integers(1, 40)),
        num_steps=draw(st.integers(0, 3)),
        drop_last=draw(st.booleans()),
        split_steps=draw(st.booleans()),
    )
    for name in draw(st.lists(st.sampled_from(sorted(WILD)), max_size=4, unique=True)):
        value = draw(WILD[name])
        if name == "shuffle":
            req.shuffle.CopyFrom(value)
        elif name == "columns":
            req.columns[:] = value
        else:
            setattr(req, name, value)
    for _ in range(draw(st.integers(0, 2))):
        op = draw(
            st.sampled_from(["text.tokenize", "text.pack", "image.decode", "nope"]) | st.text(max_size=90)
        )
        params = draw(
            st.sampled_from(["", "{}", '{"column": "text"}', '{"column": "text", "seq_len": 8}'])
            | st.text(max_size=200)
        )
        req.transforms.add(op=op, params_json=params)
    if draw(st.integers(0, 3)) == 0:  # a mixture instead
        req.dataset = ""
        for _ in range(draw(st.integers(1, 3))):
            req.mixture.add(
                dataset=draw(st.sampled_from(["toy@1", "toy", "secret@1"]) | names),
                weight=draw(st.sampled_from([1.0, 0.5]) | st.floats(allow_nan=True, allow_infinity=True)),
            )
        req.mixture_block = draw(st.sampled_from([0, 4]) | u32)
        req.mixture_epoch_samples = draw(st.sampled_from([0, 50]) | u64)
    return req


@fuzz(900)
@given(req=read_requests(), token=tokens)
def test_random_read_requests(channel: Wire, req: pb.ReadRequest, token: str) -> None:
    code, details = call(channel, "Read", req.SerializeToString(), auth(token))
    check(code, details, strings_of(req))


@fuzz(500)
@given(dataset=names, token=tokens)
def test_random_get_dataset_requests(channel: Wire, dataset: str, token: str) -> None:
    code, details = call(
        channel, "GetDataset", pb.GetDatasetRequest(dataset=dataset).SerializeToString(), auth(token)
    )
    check(code, details, [dataset])
    if code == grpc.StatusCode.OK:
        assert token == TOKEN and dataset.startswith("toy"), (
            "a dataset outside the principal's patterns was served"
        )


def test_what_the_fuzzer_may_see(server: Any, channel: Wire) -> None:
    """The fuzz server's principal reads toy* (and t?y@1), not `secret`, and ListDatasets says so."""
    lst = channel.unary_unary(
        SERVICE + "ListDatasets", response_deserializer=pb.ListDatasetsResponse.FromString
    )
    assert [d.name for d in lst(b"", timeout=10, metadata=auth(TOKEN)).datasets] == ["toy"]
    assert (
        call(
            channel, "GetDataset", pb.GetDatasetRequest(dataset="secret@1").SerializeToString(), auth(TOKEN)
        )[0]
        == grpc.StatusCode.PERMISSION_DENIED
    )
    assert Path(server.log_file).exists()
