"""The data-plane benchmark's verdicts (loadtest/flight_bench.py `summarize`): the stored order is
held to Flight from memory, a shuffle to Flight gathering the same kind of shuffle, and a pass the
CPU clock could not see gives no ratio instead of a crash. Synthetic passes: nothing is run."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from loadtest import flight_bench as fb


def _pass(path: str, mode: str, round_: int, mb_per_s: float, server_cpu: float, client_cpu: float = 0.4) -> dict[str, Any]:
    p: dict[str, Any] = {m: 1.0 for m in fb.METRICS}
    p.update(
        path=path,
        mode=mode,
        round=round_,
        rows=1000,
        batches=10,
        mb_per_s=mb_per_s,
        server_cpu_s_per_gb=server_cpu,
        client_cpu_s_per_gb=client_cpu,
        client_peak_rss_mib=None,
        server_peak_rss_mib=None,
    )
    return p


def _passes(mode: str, figures: dict[str, tuple[float, float]], rounds: int = 3) -> list[dict[str, Any]]:
    return [
        _pass(path, mode, r, mbs, cpu)
        for r in range(rounds + 1)  # round 0: the warm-up, left out
        for path, (mbs, cpu) in figures.items()
    ]


@pytest.mark.parametrize("seed", range(20))
def test_a_shuffle_is_held_to_flight_gathering_and_the_stored_order_to_flight(seed: int) -> None:
    rng = np.random.default_rng(seed)
    flight = (2500.0, 0.30)
    gather = (float(rng.uniform(1000, 2000)), float(rng.uniform(0.5, 1.2)))
    loader = (gather[0] * float(rng.uniform(0.7, 1.2)), gather[1] * float(rng.uniform(0.8, 1.4)))
    paths = (fb.BASELINE, fb.DOGET, fb.LOADER, fb.GATHER)
    passes = _passes("block", {fb.BASELINE: flight, fb.DOGET: loader, fb.LOADER: loader, fb.GATHER: gather})
    passes += _passes("none", {fb.BASELINE: flight, fb.DOGET: loader, fb.LOADER: loader})
    modes = fb.summarize(passes, paths, ("none", "block"))["modes"]

    shuffled = modes["block"]["targets"][fb.LOADER]
    assert shuffled[f"mb_per_s >= {fb.TARGET_GATHER_MB_PER_S}x gather"] == (
        loader[0] / gather[0] >= fb.TARGET_GATHER_MB_PER_S
    )
    assert shuffled[f"server_cpu_s_per_gb <= {fb.TARGET_GATHER_SERVER_CPU}x gather"] == (
        loader[1] / gather[1] <= fb.TARGET_GATHER_SERVER_CPU
    )
    assert not any("flight" in k for k in shuffled)  # a shuffle's copy is not held to Flight from memory
    stored = modes["none"]["targets"][fb.DOGET]
    assert stored == {
        f"mb_per_s >= {fb.TARGET_MB_PER_S}x flight": loader[0] / flight[0] >= fb.TARGET_MB_PER_S,
        f"server_cpu_s_per_gb <= {fb.TARGET_SERVER_CPU}x flight": loader[1] / flight[1] <= fb.TARGET_SERVER_CPU,
    }


def test_a_shuffle_without_its_baseline_gets_no_throughput_targets() -> None:
    paths = (fb.BASELINE, fb.DOGET, fb.LOADER)
    passes = _passes("full", {fb.BASELINE: (2500.0, 0.3), fb.DOGET: (1500.0, 0.6), fb.LOADER: (1400.0, 0.6)})
    targets = fb.summarize(passes, paths, ("full",))["modes"]["full"]["targets"]
    assert fb.DOGET not in targets
    assert list(targets[fb.LOADER]) == [f"client_cpu_s_per_gb <= {fb.TARGET_CLIENT_CPU}x doget's"]


def test_a_pass_the_cpu_clock_did_not_see_gives_no_ratio() -> None:
    paths = (fb.BASELINE, fb.DOGET)
    passes = _passes("none", {fb.BASELINE: (2500.0, 0.0), fb.DOGET: (2400.0, 0.3)})
    mode = fb.summarize(passes, paths, ("none",))["modes"]["none"]
    assert math.isnan(mode["ratios"][f"{fb.DOGET}/{fb.BASELINE}"]["server_cpu_s_per_gb"]["median"])
    assert mode["targets"][fb.DOGET][f"server_cpu_s_per_gb <= {fb.TARGET_SERVER_CPU}x flight"] is False
