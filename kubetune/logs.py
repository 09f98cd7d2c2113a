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

# One zone everywhere, text and JSON alike: UTC, ISO 8601 with its "Z" (a pod's local time
# is whatever its image says, and logs from several nodes must line up).
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# Loggers of libraries whose known warnings say nothing a user can act on, at every import:
# torchao's "Skipping import of cpp extensions" (its C++ kernels are built for another torch:
# we pin torchao 0.15.0 for torchtune 0.6.1, and the Python paths torchtune uses work
# without them) and "Detected no triton" (CPU machines). Errors still show.
QUIET_LIBRARY_LOGGERS = ("torchao",)
_step: str | None = None  # the step this process runs, once setup() named it


def current_step() -> str | None:
    return _step


def _word(name: str, default: str, environ: Mapping[str, str] | None) -> str:
    # Read at each use: the launcher's and the recipe's processes log the same way, and a
    # word that is not a known one means the default (never a failure to log).
    environ = os.environ if environ is None else environ
    return (environ.get(name) or default).strip().lower()


FORMATS = ("text", "json")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


def settings_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """The one line for a ``KUBETUNE_LOG_FORMAT`` / ``KUBETUNE_LOG_LEVEL`` value we do not
    know, or None. Checked where a command starts (the CLI, ``run_step``); a process below
    one (the recipe) reads the words leniently."""
    for name, known in ((env.LOG_FORMAT, FORMATS), (env.LOG_LEVEL, tuple(LEVELS))):
        word = _word(name, known[0] if name == env.LOG_FORMAT else "info", environ)
        if word not in known:
            return f"{name}={word!r} is not one of {', '.join(known)}"
    return None


def log_level(environ: Mapping[str, str] | None = None) -> int:
    return LEVELS.get(_word(env.LOG_LEVEL, "info", environ), logging.INFO)


def quiet_mode(environ: Mapping[str, str] | None = None) -> bool:
    """Warnings and errors only (``-q``, ``KUBETUNE_LOG_LEVEL=warning``): no progress."""
    return log_level(environ) > logging.INFO


def json_mode(environ: Mapping[str, str] | None = None) -> bool:
    return _word(env.LOG_FORMAT, "text", environ) == "json"


def debug_mode(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user asked for the noise too (torchtune's config dump, known warnings)."""
    return _word(env.LOG_LEVEL, "info", environ) == "debug"


def quiet_libraries(environ: Mapping[str, str] | None = None) -> None:
    """Silence the known library warnings (``QUIET_LIBRARY_LOGGERS``) unless the user asked
    for debug: a logger level, so it must be set before the library is imported, and is
    set by every process we start (``setup``; the recipe process, ``recipe_noise``)."""
    if debug_mode(environ):
        return
    for name in QUIET_LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def timestamp(when: float | None = None) -> str:
    return time.strftime(TIME_FORMAT, time.gmtime(when))


def json_line(component: str, level: str, message: str, fields: Mapping[str, Any] | None = None,
              when: float | None = None) -> str:
    """One log line as a JSON object: time, level, component, message, then ``fields``."""
    utc = timestamp(when)
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
    converter = time.gmtime  # TIME_FORMAT's "Z"

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
    root.setLevel(level if level is not None else log_level())
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    quiet_libraries()
    return logging.getLogger(step)
