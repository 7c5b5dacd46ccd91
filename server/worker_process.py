"""One worker process of a supervised server (started by supervisor.py; not a user command).

`python -m shardstream.server.worker_process SUPERVISOR_PID`, its config as JSON on stdin: runs `app.run`
with the config the supervisor made for it (its port, SO_REUSEPORT, a ready file, the grant key its
workers share), and drains if the supervisor dies. The config comes through a pipe, never the
command line or the environment, because it holds a secret (the grant key, policy/grants.py) and every
local user can read a process's command line. Errors leave as one logged line (no traceback), as
the CLI's do.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
from typing import BinaryIO

from shardstream.errors import ShardstreamError

from .lifecycle import run
from .serving.config import ServerConfig

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


def _read_config(stdin: BinaryIO) -> ServerConfig:
    """The config the supervisor wrote to this worker's stdin (then closed: read to its end)."""
    return ServerConfig.from_dict(json.loads(stdin.read()))


def main(argv: list[str]) -> int:
    cfg = _read_config(sys.stdin.buffer)
    _drain_with_parent(int(argv[1]))
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
