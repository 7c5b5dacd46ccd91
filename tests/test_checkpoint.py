"""Checkpoints through a real server (DESIGN §13): round trip with a torch model, Adam and a running
Loader; incremental bytes; integrity; permissions; follow()."""

from __future__ import annotations

import gc
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

from shardstream.checkpoint_format import chunk_key
from shardstream.client import Loader
from shardstream.client.checkpoint import Checkpointer
from shardstream.errors import (
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)

from .support.servers import Servers

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ckpt_server(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    root = tmp_path_factory.mktemp("checkpoints")
    with Servers(data_root) as servers:
        yield servers.start(metrics=True, extra_args=("--checkpoint-root", str(root))), root


def _model(seed: int) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Linear(16, 7))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _train_step(model: Any, opt: Any, batch: dict[str, np.ndarray]) -> None:
    x = torch.tensor(np.asarray(batch["x"], dtype=np.float32) / 1000)
    y = torch.tensor(np.asarray(batch["label"], dtype=np.int64))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _same_batches(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def _flat(state: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(state, dict):
        return {k: v for key, val in state.items() for k, v in _flat(val, f"{prefix}/{key}").items()}
    if isinstance(state, (list, tuple)):
        return {k: v for i, val in enumerate(state) for k, v in _flat(val, f"{prefix}/{i}").items()}
    return {prefix: state}


@pytest.mark.parametrize("steps_before", [1, 4])
def test_round_trip_model_optimizer_and_loader(ckpt_server: Any, steps_before: int) -> None:
    server, _ = ckpt_server
    job = f"roundtrip-{steps_before}"
    model, opt = _model(0)
    with Loader([server.target], "toy@1", batch_size=8, seed=3) as loader, Checkpointer([server.target], job=job) as ck:
        it = iter(loader)
        for _ in range(steps_before):
            _train_step(model, opt, next(it))
        handle = ck.save(steps_before, {"model": model.state_dict(), "optim": opt.state_dict()}, loader=loader)
        saved = {k: v.clone() if torch.is_tensor(v) else v for k, v in _flat({"model": model.state_dict(), "optim": opt.state_dict()}).items()}
        expected_next = next(it)  # the uninterrupted run's next batch (the save does not move the stream)
        _train_step(model, opt, expected_next)  # training goes on while the upload runs
        assert handle.result(timeout=60) == steps_before
        assert ck.steps() == [steps_before] and ck.latest() == steps_before

    model2, opt2 = _model(1)  # other weights, an optimizer without state
    with Loader([server.target], "toy@1", batch_size=8, seed=3) as loader2, Checkpointer([server.target], job=job) as ck2:
        into = {"model": model2.state_dict(), "optim": opt2.state_dict()}
        state = ck2.load("latest", into=into, loader=loader2)
        opt2.load_state_dict(state["optim"])
        got = _flat({"model": model2.state_dict(), "optim": opt2.state_dict()})
        assert got.keys() == saved.keys()
        for key, value in saved.items():
            if torch.is_tensor(value):
                assert value.dtype == got[key].dtype and torch.equal(value, got[key]), key  # bit-identical
            else:
                assert value == got[key], key
        assert _same_batches(next(iter(loader2)), expected_next)


def test_incremental_save_sends_what_changed(ckpt_server: Any) -> None:
    server, _ = ckpt_server
    state = {f"layer{i}": torch.randn(64 * 1024) for i in range(10)}  # 10 x 256 KiB
    with Checkpointer([server.target], job="incremental", chunk_bytes=64 << 10) as ck:
        first = ck.save(1, state)
        first.result(60)
        assert first.bytes_sent == first.bytes_total == 10 * 256 * 1024
        state["layer3"].add_(1.0)  # 10% of the state changes
        second = ck.save(2, state, blocking=True)
        assert 0.09 <= second.bytes_sent / second.bytes_total <= 0.11
        third = ck.save(3, state, blocking=True)  # nothing changed
        assert third.bytes_sent == 0
        labels = {"job_name": "incremental", "rank": "0"}
        sent = REGISTRY.get_sample_value("shardstream_client_checkpoint_sent_bytes_total", labels)
        staged = REGISTRY.get_sample_value("shardstream_client_checkpoint_state_bytes_total", labels)
        assert (sent, staged) == (first.bytes_sent + second.bytes_sent, 3 * first.bytes_total)
        loaded = ck.load(2, verify=True)  # every chunk hashed here too (end to end)
        assert all(torch.equal(loaded[k], state[k]) for k in state)
        assert ck.steps() == [1, 2, 3]


def test_a_flipped_byte_in_a_stored_chunk_is_data_loss_naming_it(ckpt_server: Any) -> None:
    server, root = ckpt_server
    job = "integrity"
    state = {"model": {"w": torch.arange(50_000, dtype=torch.float32), "b": torch.ones(3)}}
    with Checkpointer([server.target], job=job, chunk_bytes=64 << 10) as ck:
        ck.save(7, state, blocking=True)
        manifest = ck.manifest(7)
        tensor = next(t for t in manifest["parts"][0]["tensors"].values() if t["path"] == "model/w")
        h = tensor["chunks"][1][0]
        path = root / chunk_key(job, h)
        data = bytearray(path.read_bytes())
        data[1234] ^= 0x20
        path.write_bytes(bytes(data))
        with pytest.raises(DataLossError) as err:
            ck.load(7)
        assert f"{job}@7" in str(err.value) and "'model/w'" in str(err.value) and h in str(err.value)
        assert str(root) not in str(err.value)  # no server path reaches a client


def test_an_unclosed_checkpointer_warns_and_a_closed_one_does_not() -> None:
    """As a Loader: left unclosed, a ResourceWarning naming it when it is collected (no server needed:
    a Checkpointer connects on its first call)."""
    ck = Checkpointer(["127.0.0.1:1"], job="left-open", rank=0, world_size=1)
    with pytest.warns(ResourceWarning, match=r"unclosed Checkpointer\('left-open', rank=0/1\)"):
        del ck
        gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        with Checkpointer(["127.0.0.1:1"], job="closed"):
            pass
        closed = Checkpointer(["127.0.0.1:1"], job="closed")
        closed.close()
        del closed
        gc.collect()


def test_load_refuses_a_tensor_of_another_shape_and_names_missing_steps(ckpt_server: Any) -> None:
    server, _ = ckpt_server
    with Checkpointer([server.target], job="shapes") as ck:
        ck.save(1, {"w": torch.zeros(4)}, blocking=True)
        with pytest.raises(InvalidArgumentError, match="w"):
            ck.load(1, into={"w": torch.zeros(5)})
        with pytest.raises(NotFoundError):
            ck.load(2)
        with pytest.raises(InvalidArgumentError, match="job"):
            Checkpointer([server.target], job="../etc")
        with pytest.raises(InvalidArgumentError, match="Python objects"):
            ck.save(3, {"names": np.array(["a", None], dtype=object)})
        with pytest.raises(InvalidArgumentError, match="set"):
            ck.save(3, {"tags": {"a", "b"}})
        t = torch.arange(12.0).reshape(3, 4).t()  # not contiguous, either way
        ck.save(4, {"t": t}, blocking=True)
        into = {"t": torch.zeros(4, 3).t().contiguous().t()}
        assert torch.equal(ck.load(4, into=into)["t"], t) and torch.equal(into["t"], t)


def test_follow_yields_each_new_commit(ckpt_server: Any) -> None:
    server, _ = ckpt_server
    with Checkpointer([server.target], job="follow") as writer, Checkpointer([server.target], job="follow") as reader:
        writer.save(1, {"w": torch.zeros(4)}, blocking=True)
        follow = reader.follow(poll_s=0.01, timeout_s=30)
        for step in (2, 3):
            writer.save(step, {"w": torch.full((4,), float(step))}, blocking=True)
            assert next(follow) == step
            assert torch.equal(reader.load(step)["w"], torch.full((4,), float(step)))


# --- permissions ------------------------------------------------------------------------------------
TOKENS = {"trainer": "trainer-token-1", "rollout": "rollout-token-2", "other": "other-token-3"}


@pytest.fixture(scope="module")
def auth_server(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from shardstream.server.policy.auth import token_sha256

    tmp = tmp_path_factory.mktemp("ckauth")
    grants = {
        "trainer": {"checkpoints": ["run-*"]},
        "rollout": {"checkpoints_read": ["run-*"]},
        "other": {"checkpoints": ["mine-*"]},
    }
    lines = ["principals:"]
    for name, extra in grants.items():
        lines += [f"  - name: {name}", f"    token_sha256: \"{token_sha256(TOKENS[name])}\"", "    datasets: []"]
        lines += [f"    {k}: {v!r}" for k, v in extra.items()]
    (tmp / "auth.yaml").write_text("\n".join(lines) + "\n")
    with Servers(data_root) as servers:
        yield servers.start(extra_args=("--checkpoint-root", str(tmp / "ck"), "--auth", str(tmp / "auth.yaml")))


def test_writers_readers_and_others(auth_server: Any) -> None:
    target = [auth_server.target]
    ck: Callable[..., Checkpointer] = lambda who, job="run-1": Checkpointer(target, job=job, token=TOKENS[who])  # noqa: E731
    with ck("trainer") as trainer:
        trainer.save(1, {"w": torch.ones(8)}, blocking=True)
        assert trainer.steps() == [1]
    with ck("rollout") as rollout:  # a principal that may read no dataset still finds the data plane
        assert torch.equal(rollout.load("latest")["w"], torch.ones(8))
        with pytest.raises(PermissionDeniedError, match="not writable"):
            rollout.save(2, {"w": torch.zeros(8)}).result(30)
    with ck("other") as other:
        with pytest.raises(PermissionDeniedError) as existing:
            other.steps()
    with ck("other", "run-404") as other:
        with pytest.raises(PermissionDeniedError) as missing:
            other.steps()
    assert str(existing.value).replace("run-1", "J") == str(missing.value).replace("run-404", "J")
    with Checkpointer(target, job="run-1", token="wrong-token") as nobody, pytest.raises(UnauthenticatedError):
        nobody.steps()


def test_two_ranks_commit_together_and_load_on_one(ckpt_server: Any) -> None:
    server, _ = ckpt_server
    job = "two-ranks"
    loaders = [Loader([server.target], "toy@1", batch_size=4, rank=r, world_size=2, seed=1) for r in range(2)]
    ranks = [Checkpointer([server.target], job=job, rank=r, world_size=2) for r in range(2)]
    try:
        streams = [iter(ld) for ld in loaders]
        for s in streams:
            next(s), next(s)
        first = ranks[0].save(3, {"w": torch.full((5,), 0.0), "rank": 0}, loader=loaders[0])
        assert ranks[0].steps() == []  # rank 1 has not saved: nothing committed
        second = ranks[1].save(3, {"w": torch.full((5,), 1.0), "rank": 1}, loader=loaders[1])
        assert first.result(60) == second.result(60) == 3
        expected = [next(s) for s in streams]  # each rank's next batch of the uninterrupted run
        manifest = ranks[0].manifest(3)
        assert manifest["world_size"] == 2 and [p["rank"] for p in manifest["parts"]] == [0, 1]
        for r in range(2):  # each rank reads back its own part
            got = ranks[r].load(3)
            assert got["rank"] == r and torch.equal(got["w"], torch.full((5,), float(r)))
    finally:
        for c in ranks:
            c.close()
        for ld in loaders:
            ld.close()
    # one rank now (world size 1 resumes the same global position: both ranks' batches, in order)
    with Loader([server.target], "toy@1", batch_size=8, seed=1) as one, Checkpointer([server.target], job=job) as ck:
        ck.load(3, loader=one)
        batch = next(iter(one))
        both = {k: np.concatenate([np.asarray(expected[0][k]), np.asarray(expected[1][k])]) for k in batch}
        assert _same_batches(batch, both)


def test_ranks_loading_one_checkpoint_read_storage_once(ckpt_server: Any) -> None:
    from .support.servers import scrape

    server, _ = ckpt_server
    state = {f"t{i}": torch.randn(100_000) for i in range(4)}
    with Checkpointer([server.target], job="shared-load", chunk_bytes=128 << 10) as ck:
        ck.save(1, state, blocking=True)
        total = ck.manifest(1)["bytes"]
    before = scrape(server)["shardstream_checkpoint_storage_read_bytes_total"]
    errors: list[BaseException] = []

    def rank() -> None:
        try:
            with Checkpointer([server.target], job="shared-load") as mine:
                got = mine.load(1)
                assert all(torch.equal(got[k], state[k]) for k in state)
        except BaseException as exc:  # noqa: BLE001 — re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=rank) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    read = scrape(server)["shardstream_checkpoint_storage_read_bytes_total"] - before
    assert read == total  # 4 loads, one storage read of each chunk (the rest from the server's cache)


def test_an_s3_checkpoint_root(data_root: Path, s3_root: str) -> None:
    with Servers(data_root) as servers:
        server = servers.start(extra_args=("--checkpoint-root", s3_root))
        state = {"w": torch.arange(70_000, dtype=torch.float64), "meta": {"epoch": 2}}
        with Checkpointer([server.target], job="on-s3", chunk_bytes=64 << 10) as ck:
            ck.save(1, state, blocking=True)
            state["w"][:10] = -1
            assert ck.save(2, state, blocking=True).bytes_sent == 64 << 10  # one chunk changed
            got = ck.load("latest", verify=True)
            assert torch.equal(got["w"], state["w"]) and got["meta"] == {"epoch": 2}
            assert ck.steps() == [1, 2]


def test_a_server_killed_between_calls_is_left_for_the_next(data_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "shared-root"  # both servers keep the same checkpoints (one host: one directory)
    with Servers(data_root) as servers:
        fleet = [servers.start(extra_args=("--checkpoint-root", str(root))) for _ in range(2)]
        state = {"w": torch.randn(40_000)}
        with Checkpointer([s.target for s in fleet], job="failover", chunk_bytes=32 << 10) as ck:
            ck.save(1, state, blocking=True)
            first = next(s for s in fleet if ck.server.endswith(f":{s.data_port}"))
            first.kill()
            state["w"].mul_(2)
            ck.save(2, state, blocking=True)  # on the other server
            assert ck.steps() == [1, 2]
            assert torch.equal(ck.load(2)["w"], state["w"])


def test_a_failed_save_nobody_asked_about_is_raised_by_close(auth_server: Any) -> None:
    reader = Checkpointer([auth_server.target], job="run-1", token=TOKENS["rollout"])  # may not write
    reader.save(5, {"w": torch.zeros(2)})
    with pytest.raises(PermissionDeniedError, match="not writable"):
        reader.close()
    reader.close()  # once


# --- certificate principals (mTLS, no token): a grant from ListDatasets, a proof per call ------------
def test_a_certificate_principal_saves_and_loads_with_its_grant(data_root: Path, tmp_path: Path) -> None:
    import grpc
    import yaml

    from .support.certs import Pki

    pki = Pki(tmp_path / "pki")
    ca = pki.ca("ca")
    server_cert, trainer, eval_host = pki.server(ca), pki.client(ca, "trainer"), pki.client(ca, "eval")
    auth = tmp_path / "auth.yaml"
    auth.write_text(yaml.safe_dump({"principals": [
        {"name": "trainer", "mtls_subject": "CN=trainer", "datasets": [], "checkpoints": ["run-*"]},
        {"name": "eval", "mtls_subject": "CN=eval", "datasets": [], "checkpoints_read": ["run-*"]},
    ]}))  # fmt: skip
    args = (
        "--tls-cert", str(server_cert.cert), "--tls-key", str(server_cert.key), "--tls-client-ca", str(ca.cert),
        "--auth", str(auth), "--checkpoint-root", str(tmp_path / "ck"),
    )  # fmt: skip
    creds = grpc.ssl_channel_credentials(ca.pem, trainer.key.read_bytes(), trainer.pem)

    def tls(who: Any) -> dict[str, str]:
        return {"ca": str(ca.cert), "cert": str(who.cert), "key": str(who.key)}

    with Servers(data_root) as servers:
        server = servers.start(extra_args=args, credentials=creds)
        with Checkpointer([server.target], job="run-7", tls=tls(trainer), token="") as ck:
            ck.save(1, {"w": torch.arange(9.0)}, blocking=True)
            assert ck.steps() == [1]
        with Checkpointer([server.target], job="run-7", tls=tls(eval_host), token="") as ev:
            assert torch.equal(ev.load(1)["w"], torch.arange(9.0))
            with pytest.raises(PermissionDeniedError, match="not writable"):
                ev.save(2, {"w": torch.zeros(1)}).result(30)


def test_a_plain_flight_client_lists_committed_steps(ckpt_server: Any) -> None:
    import pyarrow.flight as flight

    server, _ = ckpt_server
    with Checkpointer([server.target], job="listed") as ck:
        for step in (4, 9):
            ck.save(step, {"w": torch.zeros(3)}, blocking=True)
    client = flight.connect(f"grpc+tcp://127.0.0.1:{server.data_port}")
    try:
        listed = [tuple(p.decode() for p in info.descriptor.path) for info in client.list_flights(b"listed")]
        everything = {tuple(p.decode() for p in info.descriptor.path) for info in client.list_flights()}
    finally:
        client.close()
    assert listed == [("listed", "4"), ("listed", "9")]
    assert set(listed) <= everything  # with no criteria: every job the caller may read
