"""One worker process of a supervised server (started by workers.py; not a user command).

`python -m shardstream.server.worker CONFIG_JSON SUPERVISOR_PID`: runs `app.run` with the config
the supervisor made for it (its port, SO_REUSEPORT, a ready file), and drains if the supervisor dies.
Errors leave as one logged line (no traceback), as the CLI's do.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys

from shardstream.errors import ShardstreamError

from .app import run
from .config import ServerConfig

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _drain_with_parent(parent: int) -> None:
    """SIGTERM this worker (a drain) when the supervisor dies, however it dies (Linux only)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    cfg = ServerConfig(**json.loads(argv[1]))
    _drain_with_parent(int(argv[2]))
    try:
        run(cfg)
    except ShardstreamError as exc:
        logging.getLogger("shardstream.server").error("%s", exc)  # one line, no traceback
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
