"""Logging for every step: plain lines (readable in `kubectl logs`), secrets masked."""

from __future__ import annotations

import logging
import sys

from kubetune.redact import redact


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup(step: str, level: int = logging.INFO) -> logging.Logger:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter(
        f"%(asctime)s {step} %(levelname)s %(message)s", datefmt="%Y-%m-%dT%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(step)
