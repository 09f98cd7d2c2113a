"""Logging for every step: plain lines (readable in `kubectl logs`), secrets masked;
``KUBETUNE_LOG_FORMAT=json`` turns every line into one JSON object, for log pipelines."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, Mapping

from kubetune import env
from kubetune.redact import redact

TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
_step: str | None = None  # the step this process runs, once setup() named it


def current_step() -> str | None:
    return _step


def _word(name: str, default: str, environ: Mapping[str, str] | None) -> str:
    # Read at each use: the launcher's and the recipe's processes log the same way, and a
    # word that is not a known one means the default (never a failure to log).
    environ = os.environ if environ is None else environ
    return (environ.get(name) or default).strip().lower()


def json_mode(environ: Mapping[str, str] | None = None) -> bool:
    return _word(env.LOG_FORMAT, "text", environ) == "json"


def debug_mode(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user asked for the noise too (torchtune's config dump, known warnings)."""
    return _word(env.LOG_LEVEL, "info", environ) == "debug"


def timestamp(when: float | None = None) -> str:
    return time.strftime(TIME_FORMAT, time.localtime(when))


def json_line(component: str, level: str, message: str, fields: Mapping[str, Any] | None = None,
              when: float | None = None) -> str:
    """One log line as a JSON object: time, level, component, message, then ``fields``."""
    # UTC with its zone: a log pipeline must not guess the pod's local time.
    utc = time.strftime(TIME_FORMAT, time.gmtime(when)) + "Z"
    record: dict[str, Any] = {"time": utc, "level": level, "component": component,
                              "message": redact(message)}
    for key, value in (fields or {}).items():
        record.setdefault(key, value)
    return json.dumps(record, default=str)


def wrap_foreign_line(component: str, line: str) -> str:
    """A line a library printed, in the chosen format (JSON lines stay as they are)."""
    text = line.rstrip("\n")
    if not json_mode() or text.startswith("{"):
        return line
    return json_line(component, "INFO", text, {"source": "recipe"}) + "\n"


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class _JsonFormatter(logging.Formatter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return json_line(self.component, record.levelname, message, {"logger": record.name},
                         when=record.created)


def setup(step: str, level: int | None = None) -> logging.Logger:
    global _step
    _step = step
    handler = logging.StreamHandler(sys.stderr)
    if json_mode():
        handler.setFormatter(_JsonFormatter(step))
    else:
        handler.setFormatter(_RedactingFormatter(
            f"%(asctime)s {step} %(levelname)s %(message)s", datefmt=TIME_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if level is not None else
                  logging.DEBUG if debug_mode() else logging.INFO)
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(step)
