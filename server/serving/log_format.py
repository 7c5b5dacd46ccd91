"""The server's log lines: `serve --log-format text|json`, and events with fields.

text (the default) is one human line per record:

    2026-11-26 10:00:00,123 INFO shardstream.server.serving.control_plane[4242]: stream.end id=4f1c... outcome=OK ...

json is one JSON object per line, for log pipelines (Loki, Elasticsearch, Cloud Logging):

    {"time": "2026-11-26T10:00:00.123+00:00", "level": "INFO", "logger": "shardstream.server.serving.control_plane",
     "pid": 4242, "message": "stream.end", "event": "stream.end", "stream_id": "4f1c...", ...}

An *event* (`log_event`) is a record with a name and fields: in text its message is the name followed
by `key=value` pairs, in JSON the fields are keys of the object. Anything else logged (warnings,
tracebacks) is a plain record in either format; a traceback is one "exc_info" string in JSON.
Workers of a supervisor get the same format (ServerConfig.log_format).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timezone
from typing import Any

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging", "log_event"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    """Log `event` with `fields` (text: `event k=v ...`; json: keys of the object)."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
    logger.log(level, "%s %s", event, text, extra={"event": event, "fields": fields})


def _text(value: Any) -> str:
    text = f"{value:.3f}" if isinstance(value, float) else str(value)
    return json.dumps(text) if (not text or any(c.isspace() or c in '"=' for c in text)) else text


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, pid, message, event fields."""

    def format(self, record: logging.LogRecord) -> str:
        event = getattr(record, "event", None)
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": event or record.getMessage(),
        }
        if event:
            out["event"] = event
            out.update(getattr(record, "fields", {}))
        for key, value in record.__dict__.items():  # other `extra=` keys
            if key not in _STANDARD and key not in ("event", "fields") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(log_format: str = "text", level: str | None = None) -> None:
    """The root logger of a server process: stderr, `log_format`, $SHARDSTREAM_LOG_LEVEL (INFO)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(
        level=level or os.environ.get("SHARDSTREAM_LOG_LEVEL", "INFO"), handlers=[handler], force=True
    )
