"""Progress lines for `kubectl logs`: one plain line every few seconds, never a redrawn bar."""

from __future__ import annotations

import logging
import threading
import time

from kubetune import logs
from kubetune.initializers.settings import InitializerSettings
from kubetune.remote.trainjob_status import StatusReporter, transfer_metrics

log = logging.getLogger("progress")

class Cancelled(Exception):
    """Raised into a transfer when another file failed for good: stop early."""


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Counts bytes per file from many threads and logs a summary line periodically."""

    def __init__(self, files: int, total_bytes: int, interval_s: float | None = None) -> None:
        self.files = files
        self.total_bytes = total_bytes
        self.interval_s = interval_s if interval_s is not None else \
            InitializerSettings().progress_interval_s
        self._lock = threading.Lock()
        self._bytes: dict[str, int] = {}
        self._done = 0
        self._transferred = 0  # bytes actually moved by this run (for the rate)
        self._start = time.monotonic()
        self._stop = threading.Event()
        self.cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        # Where the controller injected the TrainJob status endpoint: bytes and % done.
        self._status = StatusReporter.from_env(source="initializer")

    def __enter__(self) -> "Progress":
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self._status is not None:
            if exc_type is None:
                self._status.finish(None, None, self.status_metrics())
            else:
                self._status.close()

    def status_metrics(self) -> dict[str, object]:
        with self._lock:
            have, done = sum(self._bytes.values()), self._done
        return transfer_metrics(logs.current_step() or "initializer", have, self.total_bytes,
                                done, self.files)

    def callback(self, path: str):
        """A per-file callback for a source's ``fetch``; raises Cancelled once cancelled."""

        def advance(n: int) -> None:
            if self.cancelled.is_set():
                raise Cancelled()
            with self._lock:
                self._bytes[path] = self._bytes.get(path, 0) + n
                self._transferred += n

        return advance

    def restart_file(self, path: str, already: int) -> None:
        """A new attempt at ``path`` starts with ``already`` bytes on disk."""
        with self._lock:
            self._bytes[path] = already

    def file_done(self, path: str, size: int) -> None:
        with self._lock:
            self._bytes[path] = size
            self._done += 1

    def line(self) -> str:
        with self._lock:
            have = sum(self._bytes.values())
            moved, done = self._transferred, self._done
        elapsed = max(time.monotonic() - self._start, 1e-6)
        rate = moved / elapsed
        text = (f"progress: {done}/{self.files} files, {_mb(have)}/{_mb(self.total_bytes)} MB, "
                f"{rate / 1e6:.1f} MB/s")
        if rate > 0 and self.total_bytes > have:
            text += f", ETA {_duration((self.total_bytes - have) / rate)}"
        return text

    def summary(self) -> str:
        elapsed = time.monotonic() - self._start
        with self._lock:
            moved = self._transferred
        return (f"fetched {self._done} files, {_mb(moved)} MB transferred in {elapsed:.1f}s "
                f"({moved / max(elapsed, 1e-6) / 1e6:.1f} MB/s)")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            log.info(self.line())
            if self._status is not None:
                self._status.update(None, None, self.status_metrics())
