"""What the framework runs (tests/support/*_run.py) share: start one as a process, fingerprint its model,
read its log back."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def start_module_run(module: str, config: dict[str, Any]) -> subprocess.Popen[str]:
    """`python -m module CONFIG_JSON` in its own session (so a test can kill its whole group)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, json.dumps(config)],
        start_new_session=True,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def parameters_sha256(model: Any) -> str:
    """sha256 over a torch model's state, tensor by tensor in name order: equal iff bit-identical."""
    digest = hashlib.sha256()
    for _, p in sorted(model.state_dict().items()):
        digest.update(p.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def read_run_log(log: Path) -> tuple[list[dict[str, Any]], str | None]:
    """A run's JSON-lines log: its step rows, and the parameters' sha256 it ended on (None: killed)."""
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    ends = [r["end"] for r in rows if "end" in r]
    return [r for r in rows if "step" in r], (ends[0] if ends else None)
