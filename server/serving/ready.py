"""The ready file: how a server tells whoever started it that it serves, and where.

A JSON object (`port`, `data_port`, `metrics_port`, `pid`, `workers`: the pids serving; a supervisor
adds `restarts` and `data_ports`, each worker's data port by slot, its `data_port` being worker 0's)
written by the serving process (server/lifecycle.py) or, for several workers, by their supervisor (supervisor.py)
once all of them serve, and rewritten when a worker is replaced. Launchers
(`serve --ready-file`: server/local_fleet.py, the tests, the load test) wait for it instead of polling the port.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["write_ready_file"]


def write_ready_file(path: str, info: dict[str, object]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(path)  # atomic: a watcher sees all of it or nothing
