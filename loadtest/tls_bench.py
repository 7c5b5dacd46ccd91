"""What TLS costs: a Loader's epoch from a TLS server (and TLS + a bearer token) vs plaintext, and vs
Arrow Flight serving the same batches from memory over the same TLS.

    python -m loadtest.tls_bench [--mib 256] [--batch-mib 2] [--rounds 3] [--json PATH]

One dataset as in `loadtest.bench` (`id` + 256 float32, 1,032 B/row), three `shardstream serve`
processes over it (one worker each): plaintext, `--tls-cert/--tls-key` (an ECDSA P-256 certificate
of a CA made here, loadtest/certs.py), and the same with `--auth` (every call authenticated by a
bearer token, checked against the principal's patterns). One rank reads the whole epoch
(shuffle none, output="arrow") from each in turn: a warm-up round, then --rounds rounds, the ways
alternating within each (plaintext, TLS, TLS + token, plaintext, ...). The baseline: Flight DoGet
of the same batches from memory (loadtest/flight_server.py, the malloc settings shardstream applies
to itself), plaintext and with the same certificate (`grpc+tls`), read by a plain FlightClient in
this process. Reported: MB/s of Arrow payload, each way's ratio to the plaintext pass of the same
round, the Loader over TLS against Flight over TLS (MB/s and server CPU/GB: issue "performance IV",
>= 0.9x and the CPU alike), and a plain FlightClient's DoGet of the TLS server's stream (`doget-tls`,
the Loader's ReadRequest as its ticket) against it, median (min-max), and CPU seconds per GB of the client (this process)
and of the server, both sides on the same 2 cores. Figures only.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import psutil
import pyarrow.flight as flight
import yaml

from loadtest.bench import DATASET, MALLOC_ENV, FlightProcess, Layout, build_dataset
from loadtest.certs import Pki
from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from shardstream.client import Loader
from shardstream.server.local_fleet import LocalServer
from shardstream.server.policy.auth import token_sha256
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["main"]

TOKEN = "tls-bench-token-0123456789"
WAYS = ("plaintext", "tls", "tls+token", "doget-tls", "flight", "flight-tls")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _server_cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def flight_epoch(port: int, ca: bytes | None) -> int:
    """Flight DoGet of the baseline's table (any ticket but its generator's and gather's: the table)."""
    client = flight.connect(f"grpc+tls://127.0.0.1:{port}", tls_root_certs=ca) if ca else flight.connect(f"grpc://127.0.0.1:{port}")
    n = 0
    try:
        for chunk in client.do_get(flight.Ticket(b"table")):
            n += chunk.data.nbytes
    finally:
        client.close()
    return n


def doget_epoch(port: int, ca: bytes, batch_rows: int) -> int:
    """A plain FlightClient's DoGet of the TLS server's epoch, the Loader's ReadRequest as its ticket:
    the same stream and server as the Loader's, read without the Loader."""
    request = pb.ReadRequest(
        dataset=DATASET, world_size=1, batch_size=batch_rows, split_steps=True, provenance_in_header=True
    )
    client = flight.connect(f"grpc+tls://127.0.0.1:{port}", tls_root_certs=ca)
    n = 0
    try:
        for chunk in client.do_get(flight.Ticket(request.SerializeToString())):
            n += chunk.data.nbytes
    finally:
        client.close()
    return n


def epoch(target: str, batch_rows: int, tls: dict[str, str] | None, token: str) -> int:
    n = 0
    with Loader(
        [target], DATASET, batch_size=batch_rows, shuffle=False, output="arrow", tls=tls, token=token
    ) as ld:
        for batch in ld:
            n += batch.nbytes
    return n


def run(args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.plan(args.mib, args.batch_mib)
    with tempfile.TemporaryDirectory(prefix="shardstream-tls-") as tmp:
        work = Path(tmp)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            root, shards = pool.submit(build_dataset, work, layout).result()
        pki = Pki(work / "pki")
        ca = pki.ca()
        cert = pki.server(ca)
        auth = work / "auth.yaml"
        auth.write_text(
            yaml.safe_dump(
                {"principals": [{"name": "bench", "token_sha256": token_sha256(TOKEN), "datasets": ["*"]}]}
            )
        )
        tls_args = ("--tls-cert", str(cert.cert), "--tls-key", str(cert.key))
        creds = grpc.ssl_channel_credentials(ca.pem)
        client_tls = {"ca": str(ca.cert)}
        baseline = {"from_memory": True, "env": MALLOC_ENV}
        with (
            LocalServer(root) as plain,
            LocalServer(root, extra_args=tls_args, credentials=creds) as secure,
            LocalServer(root, extra_args=(*tls_args, "--auth", str(auth)), credentials=creds) as authed,
            FlightProcess(work, shards, layout.batch_rows, name="flight", **baseline) as fl,  # type: ignore[arg-type]
            FlightProcess(work, shards, layout.batch_rows, name="flight-tls", tls=(cert.cert, cert.key), **baseline) as fl_tls,  # type: ignore[arg-type]
        ):
            assert fl.proc is not None and fl_tls.proc is not None
            ways: dict[str, tuple[Callable[[], int], int]] = {  # way -> (one epoch: its bytes, the server's pid)
                "plaintext": (lambda: epoch(plain.target, layout.batch_rows, None, ""), plain.pid),
                "tls": (lambda: epoch(secure.target, layout.batch_rows, client_tls, ""), secure.pid),
                "tls+token": (lambda: epoch(authed.target, layout.batch_rows, client_tls, TOKEN), authed.pid),
                "doget-tls": (lambda: doget_epoch(secure.data_port, ca.pem, layout.batch_rows), secure.pid),
                "flight": (lambda: flight_epoch(fl.port, None), fl.proc.pid),
                "flight-tls": (lambda: flight_epoch(fl_tls.port, ca.pem), fl_tls.proc.pid),
            }
            passes: dict[str, list[float]] = {w: [] for w in WAYS}
            client_cpu: dict[str, list[float]] = {w: [] for w in WAYS}
            server_cpu: dict[str, list[float]] = {w: [] for w in WAYS}
            nbytes = 0
            for round_ in range(args.rounds + 1):
                for way in WAYS if round_ % 2 == 0 else WAYS[::-1]:
                    read, pid = ways[way]
                    cpu0, scpu0, t0 = _cpu_s(), _server_cpu_s(pid), time.perf_counter()
                    nbytes = read()
                    seconds = time.perf_counter() - t0
                    mbs = nbytes / seconds / 1e6
                    log(f"  {'warm-up' if round_ == 0 else f'round {round_}'} {way:<10} {mbs:6.0f} MB/s")
                    if round_:
                        passes[way].append(mbs)
                        client_cpu[way].append((_cpu_s() - cpu0) / (nbytes / 1e9))
                        server_cpu[way].append((_server_cpu_s(pid) - scpu0) / (nbytes / 1e9))
    ratios = {w: [x / y for x, y in zip(passes[w], passes["plaintext"], strict=True)] for w in WAYS[1:4]}
    ratios["flight-tls"] = [x / y for x, y in zip(passes["flight-tls"], passes["flight"], strict=True)]

    def over(a: dict[str, list[float]], way: str, base: str) -> dict[str, float]:
        return spread([x / y for x, y in zip(a[way], a[base], strict=True)])

    against_flight = {  # the Loader over TLS against Flight over the same TLS, per round
        "mb_per_s": over(passes, "tls", "flight-tls"),
        "server_cpu_s_per_gb": over(server_cpu, "tls", "flight-tls"),
        "client_cpu_s_per_gb": over(client_cpu, "tls", "flight-tls"),
    }
    doget_against_flight = {  # a plain DoGet of the same TLS server's stream against Flight over TLS
        "mb_per_s": over(passes, "doget-tls", "flight-tls"),
        "server_cpu_s_per_gb": over(server_cpu, "doget-tls", "flight-tls"),
    }
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.tls_bench", *sys.argv[1:]]),
        "config": {
            **vars(args),
            "json": str(args.json),
            "batch_rows": layout.batch_rows,
            "rows": layout.num_rows,
            "epoch_bytes": nbytes,
            "certificate": "ECDSA P-256, TLS 1.3 (grpc's BoringSSL)",
        },
        "versions": versions("shardstream", "grpcio", "cryptography"),
        "mb_per_s": {w: spread(v) for w, v in passes.items()},
        "ratio_to_plaintext": {w: spread(v) for w, v in ratios.items()},  # flight-tls: to Flight's plaintext
        "tls_against_flight_tls": against_flight,
        "doget_tls_against_flight_tls": doget_against_flight,
        "client_cpu_s_per_gb": {w: spread(v) for w, v in client_cpu.items()},
        "server_cpu_s_per_gb": {w: spread(v) for w, v in server_cpu.items()},
        "passes": passes,
    }


def print_report(res: dict[str, Any]) -> None:
    print(
        f"\n{'way':<11} {'MB/s med (min-max)':>20} {'/ plaintext':>20} {'client CPU s/GB':>16} {'server CPU s/GB':>16}"
    )
    for w, s in res["mb_per_s"].items():
        r = res["ratio_to_plaintext"].get(w)
        rtxt = f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})" if r else "1"
        c, sv = res["client_cpu_s_per_gb"][w]["median"], res["server_cpu_s_per_gb"][w]["median"]
        print(
            f"{w:<11} {s['median']:>6.0f} ({s['min']:.0f}-{s['max']:.0f}) {rtxt:>20} {c:>16.2f} {sv:>16.2f}"
        )
    a = res["tls_against_flight_tls"]

    def fmt(r: dict[str, float]) -> str:
        return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"

    print(
        f"(flight-tls: / Flight's plaintext.) Loader over TLS / Flight over the same TLS: MB/s {fmt(a['mb_per_s'])} "
        f"(target >= 0.9), server CPU/GB {fmt(a['server_cpu_s_per_gb'])}, client CPU/GB {fmt(a['client_cpu_s_per_gb'])}"
    )
    d = res.get("doget_tls_against_flight_tls")
    if d:
        print(
            f"A plain DoGet of the same TLS server's stream / Flight over TLS: MB/s {fmt(d['mb_per_s'])}, "
            f"server CPU/GB {fmt(d['server_cpu_s_per_gb'])}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.tls_bench", __doc__)
    ap.add_argument("--mib", type=int, default=256, help="dataset payload (default 256)")
    ap.add_argument("--batch-mib", type=float, default=2.0, help="batch size (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds after a warm-up (default 3)")
    return bench_main(ap, argv, run, json_default=results_path("tls_bench"), report=print_report)


if __name__ == "__main__":
    sys.exit(main())
