"""Run the recipe process(es): start them, stream their output through redact, turn
SIGTERM into a stop at the next step (a kill when the grace period runs out), and collect
the failure record a failing process left."""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TextIO

from kubetune import env
from kubetune.logs import wrap_foreign_line
from kubetune.parent_death import die_with_parent
from kubetune.redact import redact
from kubetune.trainer.failures.failure_record import FailureRecord, first_failure

log = logging.getLogger("trainer")


@dataclasses.dataclass
class RecipeRun:
    """What one run of the recipe process(es) left for the launcher to judge."""
    code: int
    wall_s: float
    started_at: float  # wall clock, to tell this run's resume record from an older one
    tail: collections.deque  # the recipe's last stderr lines
    signalled: bool  # we forwarded a stop to it
    killed: bool  # its grace period ran out
    failure: FailureRecord | None = None  # what a failing process said, by type


def stream(pipe: IO[bytes], sink: TextIO, tail: collections.deque) -> None:
    """Copy the recipe's lines to ``sink`` redacted, keeping the last ones in ``tail``."""
    for raw in iter(pipe.readline, b""):
        line = redact(raw.decode("utf-8", "replace"))
        sink.write(wrap_foreign_line("trainer", line))
        sink.flush()
        if line.strip():
            tail.append(line.rstrip())


class Supervisor:
    """SIGTERM (pod eviction) -> ask the recipe to stop at the next step; kill it when
    the grace period runs out."""

    def __init__(self, child: subprocess.Popen, stop_file: Path, grace_s: float) -> None:
        self.child, self.stop_file, self.grace_s = child, stop_file, grace_s
        self.stopped_at: float | None = None
        self.killed = False
        self._previous = {}

    def __enter__(self) -> "Supervisor":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self.stop_file.unlink(missing_ok=True)

    def _on_signal(self, signum, frame) -> None:
        if self.stopped_at is not None:
            return
        self.stopped_at = time.monotonic()
        log.info("%s: saving a resumable checkpoint at the next step (grace period %.0f s)",
                 signal.Signals(signum).name, self.grace_s)
        self.stop_file.write_text(str(signum))
        threading.Thread(target=self._deadline, daemon=True).start()

    def _deadline(self) -> None:
        try:
            self.child.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            self.killed = True
            log.info("grace period over: stopping the recipe without a new checkpoint")
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_recipe(command: list[str], child_env: dict[str, str], grace_s: float) -> RecipeRun:
    """Start the recipe process(es) in ``child_env``, stream their output through redact,
    wait for them; a failed run brings back the lowest rank's failure record."""
    log.info("launching: %s", " ".join(command))
    stop_file = Path(tempfile.gettempdir()) / f"kubetune-stop-{os.getpid()}"
    stop_file.unlink(missing_ok=True)
    # A directory of this run's own, gone after it: a record there is never an earlier
    # run's, whatever that run left behind.
    with tempfile.TemporaryDirectory(prefix="kubetune-failure-") as failure_dir:
        child_env = {**child_env, env.STOP_FILE: str(stop_file), env.FAILURE_DIR: failure_dir}
        ran = _run(command, child_env, stop_file, grace_s)
        if ran.code != 0:
            ran.failure = first_failure(failure_dir)
    return ran


def _run(command: list[str], child_env: dict[str, str], stop_file: Path,
         grace_s: float) -> RecipeRun:
    start, started_at = time.monotonic(), time.time()
    tail: collections.deque = collections.deque(maxlen=200)
    # Both of the recipe's streams pass through redact: it prints configs and URLs too.
    child = subprocess.Popen(command, env=child_env, stderr=subprocess.PIPE,
                             stdout=subprocess.PIPE, start_new_session=True,
                             preexec_fn=die_with_parent)
    with Supervisor(child, stop_file, grace_s) as supervisor:
        readers = [threading.Thread(target=stream, args=(child.stderr, sys.stderr, tail),
                                    daemon=True),
                   threading.Thread(target=stream, args=(child.stdout, sys.stdout,
                                                         collections.deque(maxlen=1)),
                                    daemon=True)]
        for reader in readers:
            reader.start()
        code = child.wait()
        for reader in readers:
            reader.join(timeout=10)
    return RecipeRun(code, time.monotonic() - start, started_at, tail,
                     signalled=supervisor.stopped_at is not None, killed=supervisor.killed)
