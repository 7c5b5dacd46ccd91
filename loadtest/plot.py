"""The PNG of a `python -m loadtest` result: throughput, batch-wait CDF, CPU and RSS per process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["plot_load"]


def plot_load(res: dict[str, Any], path: Path) -> None:
    cfg, tot, tl = res["config"], res["total"], res["timeline"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    ax = axes[0][0]
    bin_s = tl["bin_s"]
    for name, series in tl["samples_per_s"].items():
        ax.plot(np.arange(len(series)) * bin_s, series, label=name, lw=1)
    ax.set(title="delivered samples/s per rank", xlabel="s since go", ylabel="samples/s")
    ax.legend(fontsize=7)
    ax = axes[0][1]
    for name, q in tl["wait_ms_sorted"].items():
        if q:
            ax.plot(np.maximum(q, 1e-3), np.linspace(0, 1, len(q)), label=name, lw=1)
    ax.set_xscale("log")
    ax.set(title="batch wait (time in next(), first batch apart): CDF", xlabel="ms", ylabel="fraction")
    ax.legend(fontsize=7)
    for ax, idx, title, unit in (
        (axes[1][0], 1, "CPU per process", "% of one core"),
        (axes[1][1], 2, "RSS per process", "MiB"),
    ):
        for name, samples in tl["samples"].items():
            if samples:
                arr = np.asarray(samples)
                ax.plot(
                    arr[:, 0], arr[:, idx], label=name, lw=1, ls="--" if name.startswith("server") else "-"
                )
        ax.set(title=title, xlabel="s since go", ylabel=unit)
        ax.legend(fontsize=7)
    amp = tot["read_amplification"]
    fig.suptitle(
        f"{cfg['servers']} servers x {cfg['ranks']} ranks, batch {cfg['batch_size']}, step {cfg['step_ms']:g} ms, "
        f"shuffle {cfg['shuffle']}: {tot['samples_per_s']:,.0f} samples/s, {tot['mb_per_s']:.0f} MB/s, "
        f"wait p50/p99 {tot['wait_p50_ms'] or 0:.2f}/{tot['wait_p99_ms'] or 0:.2f} ms, "
        f"stall {100 * (tot['stall_fraction_mean'] or 0):.1f}%, read amplification "
        f"{'-' if amp is None else f'{amp:.2f}'}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
