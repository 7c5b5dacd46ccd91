"""Honest failover against real servers: the retry budget lasts `timeout_s` (a restart of the only server
does not end training), and DATA_LOSS from one server is tried once on another before it reaches the
training loop."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY

from shardstream.client import Loader
from shardstream.errors import DataLossError

from .support.data import N_ROWS
from .support.servers import wait_for


def client_retries() -> float:
    """Stream retries of every Loader in this process (the series carry job_name and rank labels)."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == "shardstream_client_stream_retries_total"
    )


def test_a_restart_of_the_only_server_is_waited_for_within_timeout_s(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory()
    # max_retries=1 alone would give up at the second failed attempt; timeout_s keeps the stream trying
    with Loader([server.target], "toy@1", batch_size=7, max_retries=1, timeout_s=120, seed=4) as ld:
        assert ld.target.num_rows == N_ROWS  # resolved while the server is up
        before = client_retries()
        server.kill()  # the Read finds no server until it is back

        def restart_after_retries() -> None:
            wait_for(lambda: client_retries() >= before + 3, "the stream to fail more than max_retries times")
            server.start()  # same port

        restarter = threading.Thread(target=restart_after_retries, daemon=True)
        restarter.start()
        got = [b["id"] for b in ld]
        restarter.join(timeout=120)
    assert client_retries() >= before + 3
    assert sorted(np.concatenate(got).tolist()) == list(range(N_ROWS))  # every sample exactly once


def corrupt_copy(data_root: Path, dest: Path) -> Path:
    """A copy of the root whose `toy` shards each have one byte flipped in the middle."""
    shutil.copytree(data_root, dest)
    shards = sorted((dest / "toy").rglob("*.parquet"))
    assert shards
    for path in shards:
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))
    return dest


def test_data_loss_from_one_server_is_read_from_another(
    server_factory, data_root: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    bad = server_factory(root=corrupt_copy(data_root, tmp_path / "bad"))
    good = server_factory()
    before = client_retries()
    # rank 0 starts on the first endpoint: the server whose copy is corrupt
    with Loader([bad.target, good.target], "toy@1", batch_size=10, seed=2) as ld:
        ids = np.concatenate([b["id"] for b in ld]).tolist()
    assert sorted(ids) == list(range(N_ROWS))
    assert client_retries() >= before + 1


def test_data_loss_on_every_server_reaches_the_training_loop(
    server_factory, data_root: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    a = server_factory(root=corrupt_copy(data_root, tmp_path / "a"))
    b = server_factory(root=corrupt_copy(data_root, tmp_path / "b"))
    with (
        Loader([a.target, b.target], "toy@1", batch_size=10) as ld,
        pytest.raises(DataLossError, match="toy@1"),
    ):
        for _ in ld:
            pass
