"""The benchmarks' one command line (loadtest/common.py: bench_parser, bench_main): every benchmark
module's --help, and what bench_main does in which order. Nothing here runs a benchmark."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from loadtest.common import RESULTS, bench_main, bench_parser, results_path

BENCHMARKS = [
    "loadtest.ab_commits",
    "loadtest.autoscale_bench",
    "loadtest.balance_bench",
    "loadtest.balance_train",
    "loadtest.bench",
    "loadtest.build_bench",
    "loadtest.bulk_bench",
    "loadtest.chaos",
    "loadtest.checkpoint_bench",
    "loadtest.cli",
    "loadtest.client_bench",
    "loadtest.decode_bench",
    "loadtest.epoch_gap_bench",
    "loadtest.flight_bench",
    "loadtest.gpu_check",
    "loadtest.hf_resume_bench",
    "loadtest.integrity_bench",
    "loadtest.plan_bench",
    "loadtest.resume_bench",
    "loadtest.scale",
    "loadtest.scaling",
    "loadtest.schedule_bench",
    "loadtest.stall_bench",
    "loadtest.storage_bench",
    "loadtest.streams_bench",
    "loadtest.suite",
    "loadtest.tls_bench",
    "loadtest.transform_bench",
    "loadtest.viz_bench",
    "loadtest.workers_bench",
]


def test_every_benchmark_module_is_listed() -> None:
    """A loadtest module that builds its command line with bench_parser is a benchmark: listed above."""
    here = Path(__file__).resolve().parents[1] / "loadtest"
    found = {
        f"loadtest.{p.stem}"
        for p in here.glob("*.py")
        if p.stem != "common" and "bench_parser(" in p.read_text()
    }
    assert found == set(BENCHMARKS)


@pytest.mark.parametrize("module", BENCHMARKS)
def test_every_benchmark_has_the_shared_command_line(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    prog = "python -m loadtest" if module == "loadtest.cli" else f"python -m {module}"
    assert out.startswith(f"usage: {prog} ")
    assert "--json PATH" in out
    if module != "loadtest.cli":  # the load test writes JSON only when asked
        assert f"(default loadtest/results/{module.split('.')[1]}.json)" in " ".join(out.split())


def test_bench_main_checks_runs_reports_writes_then(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[str] = []

    def check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        seen.append("check")
        args.double = args.n * 2  # a default derived from another option

    def run(args: argparse.Namespace) -> dict[str, Any]:
        seen.append("run")
        return {"n": args.n, "double": args.double}

    def report(result: dict[str, Any]) -> None:
        assert not (tmp_path / "r.json").exists()
        seen.append("report")
        print("figures", result["double"])

    def then(args: argparse.Namespace, result: dict[str, Any]) -> None:
        assert json.loads(args.json.read_text()) == result
        seen.append("then")

    ap = bench_parser("loadtest.toy", "A toy benchmark.\n\nMore words.")
    ap.add_argument("--n", type=int, default=1)
    code = bench_main(
        ap,
        ["--n", "3", "--json", str(tmp_path / "r.json")],
        run,
        json_default=results_path("toy"),
        report=report,
        check=check,
        then=then,
    )
    assert code == 0 and seen == ["check", "run", "report", "then"]
    assert capsys.readouterr().out == f"figures 6\n\nwrote {tmp_path / 'r.json'}\n"
    assert json.loads((tmp_path / "r.json").read_text()) == {"n": 3, "double": 6}


def test_bench_main_exit_status_and_optional_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(args: argparse.Namespace) -> dict[str, Any]:
        return {"ok": args.ok}

    def main(argv: list[str]) -> int:
        ap = bench_parser("loadtest.toy", "A toy.")
        ap.add_argument("--ok", action="store_true")
        return bench_main(ap, argv, run, json_default=None, failed=lambda r: not r["ok"])

    assert main(["--ok"]) == 0 and main([]) == 1
    assert capsys.readouterr().out == ""  # no --json: nothing written
    assert results_path("toy") == RESULTS / "toy.json"
