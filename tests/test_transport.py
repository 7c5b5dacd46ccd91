"""The client's one transport session (client/transport/): reads and checkpoint calls over the same
Flight options, discovery and RetryPolicy — without a server (scripted connections, a fake clock).

A Loader's Read and a Checkpointer's call dial the data plane with the one FLIGHT_OPTIONS list, ping
timeout included (before, the checkpoint list had 2 of its 5 keys: a blackholed server went unnoticed
for 60 s on a save instead of 5); a checkpoint call that fails as a stream would be resumed elsewhere
is retried on the next endpoint with the policy's backoff, until its count and time budget are spent.
The last test does it against real servers: a checkpoint call on a data plane that goes silent
(a blackhole proxy: it accepts, sends nothing) moves to the other server after a keepalive ping and
its timeout (10 s + 5 s), well before gRPC's default ping timeout (60 s) would have ended it. Servers
killed between calls: test_checkpoint.py.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.flight as flight
import pytest

from loadtest.chaos_net import Blackhole
from shardstream.client.checkpoint import Checkpointer
from shardstream.client.checkpoint.transport import CheckpointSession
from shardstream.client.credentials import ChannelSecurity
from shardstream.client.spec import RetryPolicy
from shardstream.client.transport import channel, fleet
from shardstream.client.transport.channel import FLIGHT_OPTIONS, Connection
from shardstream.client.transport.retry import Attempts
from shardstream.errors import PermissionDeniedError, ResourceExhaustedError, UnavailableError
from shardstream.v1 import shardstream_pb2 as pb

from .support.fake_clock import Clock
from .support.servers import Servers, data_port_behind, unused_port


class Recorder(ChannelSecurity):
    """Plain channels, and a record of every data-plane client asked for (its options)."""

    def flight_client(self, host: str, port: int, options: list[tuple[str, Any]], server_name: str | None = None) -> Any:
        dialled.append((f"{host}:{port}", list(options)))
        return FakeFlight()


dialled: list[tuple[str, list[tuple[str, Any]]]] = []


class FakeFlight:
    def do_get(self, ticket: Any, options: Any) -> Any:
        raise flight.FlightUnavailableError("scripted: no server")

    def do_action(self, action: Any, options: Any) -> Any:
        return iter([flight.Result(b'{"steps": [1, 2]}')])


@pytest.fixture
def discovery_without_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every server names data port 9000 (GetDataset for a Read, ListDatasets for a checkpoint call)."""
    dialled.clear()

    def discover(self: Connection, dataset: str | None) -> int:
        return self._remember(pb.ListDatasetsResponse(data_port=9000), self._host)

    monkeypatch.setattr(Connection, "_discover", discover)


@pytest.mark.usefixtures("discovery_without_a_server")
def test_reads_and_checkpoint_calls_dial_the_data_plane_with_the_one_option_list() -> None:
    security = Recorder()
    reads = fleet.Fleet(["127.0.0.1:7070"], security, RetryPolicy(), owner="Loader")
    call = reads.open_read("127.0.0.1:7070", pb.ReadRequest(dataset="toy"))
    call.cancel()
    session = CheckpointSession(["127.0.0.2:7070"], "run-1", security)
    assert session.action("checkpoint.steps", {"job": "run-1"}) == {"steps": [1, 2]}
    assert session.target == "127.0.0.2:9000"
    (read_at, read_options), (ckpt_at, ckpt_options) = dialled
    assert (read_at, ckpt_at) == ("127.0.0.1:9000", "127.0.0.2:9000")
    assert read_options == ckpt_options == FLIGHT_OPTIONS
    options = dict(ckpt_options)
    # a silent server is noticed after a ping and its timeout (10 s + 5 s), not gRPC's 60 s default
    assert options["grpc.http2.ping_timeout_ms"] == options["grpc.keepalive_timeout_ms"] == 5_000
    assert options["grpc.keepalive_time_ms"] == 10_000
    assert len(options) == len(FLIGHT_OPTIONS) == 5
    reads.close()
    session.close()


def scripted(monkeypatch: pytest.MonkeyPatch, failures: dict[str, list[BaseException]]) -> list[str]:
    """Connections whose data plane answers as `failures` says, in turn; the endpoints asked, in order."""
    asked: list[str] = []

    class Plane:
        def __init__(self, endpoint: str) -> None:
            self.target = endpoint

    class Conn:
        def __init__(self, target: str, security: Any) -> None:
            self.target = target

        def data_plane(self, dataset: str | None) -> Plane:
            asked.append(self.target)
            script = failures.get(self.target, [])
            if script:
                raise script.pop(0)
            return Plane(self.target)

        def forget_data_port(self) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(fleet, "Connection", Conn)
    return asked


def test_a_checkpoint_call_backs_off_to_the_next_endpoint_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    down = UnavailableError("UNAVAILABLE: scripted")
    asked = scripted(monkeypatch, {"a:1": [down, down], "b:2": [down]})
    clock = Clock()
    policy = RetryPolicy(max_retries=6, budget_s=10.0, backoff_base_s=1.0, backoff_max_s=1.0)
    f = fleet.Fleet(["a:1", "b:2"], None, policy, clock=clock, sleep=clock.sleep)
    assert f.call(lambda plane: plane.target) == "b:2"  # its third failure's next endpoint answers
    assert asked == ["a:1", "b:2", "a:1", "b:2"]  # round the list, one endpoint per failure
    assert len(clock.sleeps) == 3 and all(0 <= s <= 1.0 for s in clock.sleeps)  # a jittered backoff each


def test_a_checkpoint_call_gives_up_once_count_and_time_are_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = scripted(monkeypatch, {"a:1": [UnavailableError("UNAVAILABLE: scripted")] * 1000})
    clock = Clock()
    policy = RetryPolicy(max_retries=2, budget_s=30.0, backoff_base_s=1.0, backoff_max_s=1.0)
    monkeypatch.setattr(RetryPolicy, "backoff_s", lambda self, failures: 1.0)  # no jitter: count the seconds
    f = fleet.Fleet(["a:1"], None, policy, clock=clock, sleep=clock.sleep)
    with pytest.raises(UnavailableError, match="scripted"):
        f.call(lambda plane: plane.target)
    # more than max_retries failures were not enough: the first of them had to be budget_s old
    assert clock.now == 30.0 and len(asked) == 31


def test_a_checkpoint_call_hands_on_any_other_error_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = scripted(monkeypatch, {"a:1": [PermissionDeniedError("not writable")]})
    clock = Clock()
    f = fleet.Fleet(["a:1", "b:2"], None, RetryPolicy(), clock=clock, sleep=clock.sleep)
    with pytest.raises(PermissionDeniedError):
        f.call(lambda plane: plane.target)
    assert asked == ["a:1"] and clock.sleeps == []


def test_a_checkpoint_call_retries_an_overloaded_server_but_not_a_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = ResourceExhaustedError("no room in flight", retry_after_s=1.0)  # says when to come back
    asked = scripted(monkeypatch, {"a:1": [busy]})
    clock = Clock()
    f = fleet.Fleet(["a:1", "b:2"], None, RetryPolicy(), clock=clock, sleep=clock.sleep)
    assert f.call(lambda plane: plane.target) == "b:2" and asked == ["a:1", "b:2"]
    full = ResourceExhaustedError("job j is over its quota")  # no hint: waiting does not clear it
    asked = scripted(monkeypatch, {"a:1": [full], "b:2": [full]})
    f = fleet.Fleet(["a:1", "b:2"], None, RetryPolicy(), clock=clock, sleep=clock.sleep)
    with pytest.raises(ResourceExhaustedError, match="quota"):
        f.call(lambda plane: plane.target)
    assert asked == ["a:1"] and len(clock.sleeps) == 1  # the overloaded server's one backoff, none since


def test_a_flight_error_of_the_call_itself_is_retried_as_one_of_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, {})
    clock = Clock()
    f = fleet.Fleet(["a:1", "b:2"], None, RetryPolicy(backoff_base_s=0.0), clock=clock, sleep=clock.sleep)
    seen: list[str] = []

    def call(plane: Any) -> str:
        seen.append(plane.target)
        if len(seen) == 1:
            raise flight.FlightUnavailableError("scripted: connection reset")
        return plane.target

    assert f.call(call) == "b:2" and seen == ["a:1", "b:2"]


def test_attempts_count_failures_in_a_row_and_progress_resets_them() -> None:
    clock = Clock()
    attempts = Attempts(RetryPolicy(max_retries=1, budget_s=5.0), clock)
    assert attempts.failed() and attempts.failures == 1
    clock.now = 4.0
    assert attempts.failed()  # 2 > max_retries, but only 4 s of the 5
    clock.now = 5.0
    assert not attempts.failed()  # both spent
    attempts.progress()
    assert attempts.failed() and attempts.failing_s == 0.0


def test_the_dead_data_plane_branch_is_gone() -> None:
    """Endpoints are control ports (host:port or dns:///host:port): a grpc+tcp:// one is refused with
    the form to use, and no message sends users to it."""
    import inspect

    from shardstream.client.checkpoint import transport
    from shardstream.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="has a scheme"):
        CheckpointSession(["grpc+tcp://127.0.0.1:7071"], "run-1", ChannelSecurity())
    assert "grpc+tcp" not in inspect.getsource(transport) and "grpc+tcp" not in inspect.getsource(channel)


# --- against real servers --------------------------------------------------------------------------
SILENT_BOUND_S = 45.0  # a ping and its timeout: 15 s; gRPC's default ping timeout alone: 60 s


def test_a_blackholed_data_plane_is_left_within_the_ping_timeout_on_a_checkpoint_call(
    data_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "checkpoints"  # both servers keep the same checkpoints (one host: one directory)
    data_port = unused_port()
    with Blackhole(data_port) as proxy, Servers(data_root) as servers:
        behind = servers.start(extra_args=("--checkpoint-root", str(root), *data_port_behind(proxy, data_port)))
        stable = servers.start(extra_args=("--checkpoint-root", str(root)))
        # a job whose calls start at the server behind the proxy (the ranks of a job start at one, by its name)
        job = next(j for j in (f"silent-{i}" for i in range(64)) if int(hashlib.sha256(j.encode()).hexdigest(), 16) % 2 == 0)
        with Checkpointer([behind.target, stable.target], job=job) as ck, caplog.at_level(logging.WARNING):
            assert ck.steps() == [] and ck.server.endswith(f":{proxy.port}")
            proxy.blackhole()
            got: list[Any] = []
            t0 = time.monotonic()
            thread = threading.Thread(target=lambda: got.append(ck.steps()), daemon=True)
            thread.start()
            thread.join(SILENT_BOUND_S)
            waited_s = time.monotonic() - t0
            assert got == [[]], f"the call on a silent data plane did not move on within {waited_s:.0f} s"
            assert ck.server.endswith(f":{stable.data_port}") and proxy.swallowed_bytes > 0
        assert any("retrying on" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
