"""The path of a Loader's `dataset` argument to the server, each stop once (issue #40): one
`DatasetRef.parse` of each ref on the client, one GetDataset of each ref per Loader start on the
endpoint it asks — host:port and dns:/// alike (a dns:/// name's answer names the address the Read
then dials: no second GetDataset to discover it) — and a StepReader's control calls in the
transport's one retry loop (transport/fleet.py: ask_in_turn), not a loop of their own."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shardstream.client import Loader, StepReader
from shardstream.client.transport import fleet as fleet_module
from shardstream.errors import UnavailableError
from shardstream.names import DatasetRef
from shardstream.server.local_fleet import LocalServer
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import N_ROWS
from .support.servers import rpc_count, scrape


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """DatasetRef.parse calls in this process, by the text parsed."""
    seen: Counter[str] = Counter()
    parse = DatasetRef.parse.__func__  # type: ignore[attr-defined]

    def counting(cls: type[DatasetRef], text: object) -> DatasetRef:
        seen[str(text)] += 1
        return parse(cls, text)  # type: ignore[no-any-return]

    monkeypatch.setattr(DatasetRef, "parse", classmethod(counting))
    yield seen


def _endpoint(kind: str, server: LocalServer) -> str:
    return server.target if kind == "host:port" else f"dns:///localhost:{server.port}"


@pytest.mark.parametrize("kind", ["host:port", "dns:///"])
@pytest.mark.parametrize(
    ("dataset", "refs"),
    [("toy", ["toy"]), ({"toy@1": 1.0, "toy@2": 1.0}, ["toy@1", "toy@2"])],
    ids=["plain", "mixture"],
)
def test_a_loader_start_asks_one_get_dataset_per_ref_and_parses_each_ref_once(
    server_factory: Callable[..., LocalServer], parses: Counter[str], kind: str, dataset: Any, refs: list[str]
) -> None:
    server = server_factory(metrics=True)
    before = scrape(server)
    with Loader([_endpoint(kind, server)], dataset, batch_size=100, epochs=1) as loader:
        rows = sum(len(batch["id"]) for batch in loader)
    after = scrape(server)
    assert rows == (N_ROWS if isinstance(dataset, str) else loader.target.num_rows) > 0
    assert rpc_count(after, "Read") - rpc_count(before, "Read") >= 1
    # one GetDataset for each ref (the Loader's target), none more to find the data port to read from
    assert rpc_count(after, "GetDataset") - rpc_count(before, "GetDataset") == len(refs)
    assert dict(parses) == dict.fromkeys(refs, 1)  # Loader() -> normalize_dataset, and no other stop


def test_a_dns_name_is_asked_at_its_next_address_when_one_is_down(
    server_factory: Callable[..., LocalServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Loader's GetDataset of a dns:/// name goes to one address (the one its streams dial):
    an address that does not answer is skipped at once, as the round-robin channel skipped it."""
    server = server_factory(metrics=True)
    real = socket.getaddrinfo

    def down_first(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "fleet.invalid":  # 127.0.0.2: nothing listens there on the server's port
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, server.port)) for ip in ("127.0.0.2", "127.0.0.1")]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", down_first)
    before = rpc_count(scrape(server), "GetDataset")
    with Loader([f"dns:///fleet.invalid:{server.port}"], "toy@1", batch_size=100, epochs=1) as loader:
        assert sum(len(batch["id"]) for batch in loader) == N_ROWS
    assert rpc_count(scrape(server), "GetDataset") - before == 1


class _Flaky:
    """A Connection whose control-plane calls fail UNAVAILABLE `down` times, then answer."""

    asked: list[str] = []

    def __init__(self, target: str, security: object = None) -> None:
        self.target = target

    def _answer(self) -> None:
        _Flaky.asked.append(self.target)
        if len(_Flaky.asked) <= 2:
            raise UnavailableError("UNAVAILABLE: restarting")

    def list_datasets(self, timeout_s: float) -> pb.ListDatasetsResponse:
        self._answer()
        return pb.ListDatasetsResponse(datasets=[pb.DatasetInfo(name="b"), pb.DatasetInfo(name="a")])

    def get_dataset(self, dataset: str, timeout_s: float) -> pb.DatasetInfo:
        self._answer()
        return pb.DatasetInfo(name=dataset, version=1)

    def close(self) -> None:
        pass


def test_a_step_readers_get_dataset_retries_on_the_retry_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that is restarting is waited for (the policy's backoff between tries), as a Loader's
    GetDataset and the StepReader's own reads wait for it — not given up on after one pass."""
    monkeypatch.setattr(fleet_module, "Connection", _Flaky)
    monkeypatch.setattr(_Flaky, "asked", [])
    waits: list[float] = []
    with StepReader(["a:1"], timeout_s=5.0) as reader:
        reader._fleet._sleep = waits.append  # type: ignore[attr-defined]
        assert reader.dataset_info("toy").name == "toy"
    assert _Flaky.asked == ["a:1"] * 3 and len(waits) == 2  # a backoff before each try again


def test_a_step_readers_list_datasets_asks_each_endpoint_once_in_the_same_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """ListDatasets (the visualizers' reachability check) goes round the endpoints once, with the
    policy's backoff between them, and says at once when none answers."""
    monkeypatch.setattr(fleet_module, "Connection", _Flaky)
    monkeypatch.setattr(_Flaky, "asked", [])
    waits: list[float] = []
    with StepReader(["a:1", "b:2", "c:3"], timeout_s=5.0) as reader:
        reader._fleet._sleep = waits.append  # type: ignore[attr-defined]
        assert [d.name for d in reader.list_datasets()] == ["a", "b"]
    assert _Flaky.asked == ["a:1", "b:2", "c:3"] and len(waits) == 2
    monkeypatch.setattr(_Flaky, "asked", [])
    with StepReader(["a:1", "b:2"], timeout_s=5.0) as reader, pytest.raises(UnavailableError, match="a:1, b:2"):
        reader.list_datasets()
    assert _Flaky.asked == ["a:1", "b:2"]
