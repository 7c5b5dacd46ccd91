from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_runs_end_to_end_and_proves_exactly_once(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "shardstream", "demo", "--rows", "3001", "--workdir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "samples trained on: 3001 of 3001; missing 0; seen twice 0 -> EXACTLY ONCE" in r.stdout
    assert "got SIGKILL" in r.stdout and "failed over" in r.stdout
    assert "exit codes [0, 0]" in r.stdout
    assert "server-side decode" in r.stdout and "image.decode" in r.stdout
    assert "Warning" not in r.stderr, r.stderr
