"""A progress line every few seconds through a long phase that is not a training step:
held-out losses, held-out answers, checkpoint saves, exports. Each line says what is done,
of how much, the time so far and an estimate of what is left:

    validation: 12/40 batches, 0:00:31 so far, ~0:01:12 left

A thread writes the lines, so a phase whose single unit of work outlasts the interval (one
forward of a large model, one file written) is not silent either. Nothing is written for a
phase shorter than the interval. The estimate is the rate so far, carried over what is
left; ``measure`` reads what is done where the work reports nothing itself (bytes in a
directory while a library writes it).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

INTERVAL_S = 10.0  # issue 52: no phase silent for longer


def format_duration(seconds: float) -> str:
    """``H:MM:SS``, as the training progress line writes its ETA."""
    seconds = int(round(max(0.0, seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def directory_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` now (files may come and go meanwhile)."""
    total = 0
    for path in Path(root).rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:
            continue
    return total


def _number(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() or value >= 100 else f"{value:.1f}"


class PhaseProgress:
    """``with PhaseProgress("validation", 40, "batches", emit) as progress:`` then
    ``progress.advance()`` per unit done; ``emit`` None (another rank) writes nothing."""

    def __init__(self, what: str, total: float, unit: str,
                 emit: Callable[[str], None] | None, *, interval_s: float | None = None,
                 measure: Callable[[], float] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.total, self.unit = what, float(total), unit
        self.emit, self.measure, self.clock = emit, measure, clock
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self.done = 0.0
        self.note = ""  # the stage a phase of several is in, named in its line
        self.started = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PhaseProgress":
        self.started = self.clock()
        if self.emit is not None and self.interval_s > 0:
            self._thread = threading.Thread(target=self._run, name=f"progress-{self.what}",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def advance(self, units: float = 1.0) -> None:
        self.done += units

    def stage(self, name: str) -> None:
        """A phase counted in stages: the one under way done, ``name`` the next."""
        if self.note:
            self.advance()
        self.note = name

    def line(self) -> str:
        done = self.measure() if self.measure is not None else self.done
        elapsed = self.clock() - self.started
        parts = [f"{_number(done)}/{_number(self.total)} {self.unit}"]
        if self.note:
            parts.append(self.note)
        parts.append(f"{format_duration(elapsed)} so far")
        if 0 < done < self.total:
            parts.append(f"~{format_duration(elapsed * (self.total - done) / done)} left")
        elif done >= self.total:
            parts.append("finishing")
        else:
            parts.append("estimating what is left")
        return f"{self.what}: " + ", ".join(parts)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.emit(self.line())
            except Exception:  # a progress line never costs the phase
                pass
