"""`shardstream dev PATH` as a real process: every JSON Lines / Parquet file and image folder under
PATH becomes a dataset, served with the web viewer; what it prints works (the endpoint answers, the
Loader snippet runs, the web URL serves the datasets); SIGINT stops it all — the server's own process
group included — and removes its temporary registry."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.cli.dev_command import find_inputs

from .support.media import real_images
from .support.servers import unused_port, unused_port_range


def make_tree(top: Path) -> Path:
    (top / "corpus" / "more").mkdir(parents=True)
    with (top / "corpus" / "notes.jsonl").open("w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"note {i}", "label": i % 3}) + "\n")
    pq.write_table(pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]}), top / "corpus" / "more" / "table v2.parquet")
    for i, (name, data) in enumerate(real_images()[:6]):
        cls = top / "corpus" / "pics" / ("cat" if i % 2 else "dog")
        cls.mkdir(parents=True, exist_ok=True)
        (cls / f"{i}{Path(name).suffix}").write_bytes(data)
    (top / "corpus" / ".hidden.jsonl").write_text("not json\n")
    return top / "corpus"


def test_inputs_are_found_one_dataset_each(tmp_path: Path) -> None:
    corpus = make_tree(tmp_path)
    got = [(name, p.relative_to(corpus).as_posix(), fmt) for name, p, fmt in find_inputs(corpus)]
    assert got == [("table-v2", "more/table v2.parquet", "parquet"), ("notes", "notes.jsonl", "jsonl"), ("pics", "pics", "images")]


def test_dev_serves_a_folder_and_stops_everything_on_sigint(tmp_path: Path) -> None:
    corpus = make_tree(tmp_path)
    port, web_port = unused_port_range(2), unused_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardstream", "dev", str(corpus), "--port", str(port), "--web-port", str(web_port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path,
    )
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C"):
                break
        out = "\n".join(lines)
        assert proc.poll() is None, out + proc.stderr.read()  # type: ignore[union-attr]
        assert re.search(r"notes@1 +40 rows +jsonl .* columns text, label", out), out
        assert "pics@1" in out and "table-v2@1" in out
        assert f"endpoint: 127.0.0.1:{port} " in out and f"data port {port + 1}" in out
        registry = re.search(r"registry (\S+)", out)[1]  # type: ignore[index]
        # the snippet runs as printed
        snippet = "\n".join(line[2:] for line in lines[lines.index("Loader:") + 1 : -1])
        run = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout.strip() == "{'x': (3,), 'y': (3,)}"  # the first dataset's first batch, run.stderr
        with urllib.request.urlopen(f"http://localhost:{web_port}/", timeout=30) as resp:
            page = resp.read().decode()
        assert resp.status == 200 and all(n in page for n in ("notes", "pics", "table-v2"))
        server = [p for p in psutil.process_iter(["cmdline"]) if "serve" in (p.info["cmdline"] or []) and registry in " ".join(p.info["cmdline"] or [])]
        assert len(server) == 1 and server[0].pid != proc.pid

        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in its terminal: the foreground group gets SIGINT
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read().strip() == "shardstream dev: stopped (server and web viewer)"  # type: ignore[union-attr]
        assert not proc.stderr.read().strip()  # type: ignore[union-attr]
        assert not psutil.pid_exists(server[0].pid) or server[0].status() == psutil.STATUS_ZOMBIE
        assert not Path(registry).exists()
        for p in (port, web_port):
            with pytest.raises(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{p}/", timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_a_path_without_inputs_or_a_busy_port_is_one_line(tmp_path: Path) -> None:
    from .support.processes import run_cli

    proc = run_cli("dev", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        f"shardstream: error: {tmp_path}: no JSON Lines or Parquet file and no image folder (DIR/<class>/<image>) under it"
    ]
    corpus = make_tree(tmp_path)
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        proc = run_cli("dev", str(corpus), "--port", "0", "--web-port", str(taken), cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        f"shardstream: error: port {taken} (the web viewer) is in use on 127.0.0.1: give --web-port N (0 for any free port)"
    ]
