"""The command line and fresh interpreters as subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["finish_group", "run_cli", "same_output_in_processes"]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m shardstream ARGS` in `cwd`, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "shardstream", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def same_output_in_processes(code: str, hash_seeds: tuple[int, ...] = (0, 7, 12345)) -> str:
    """Run `code` in fresh interpreters with different PYTHONHASHSEEDs; assert one output, return it."""
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(h), "PATH": ""},
        ).stdout
        for h in hash_seeds
    }
    assert len(outs) == 1, outs
    return outs.pop()


def finish_group(proc: subprocess.Popen[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Wait for `proc` (started with start_new_session=True) and collect its output; whatever of its
    process group is still running then — it timed out, or the test failed — is killed."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
