"""Run pipeline steps on this machine the way a JobSet runs them in a cluster.

Each step is its own process with the environment its pod would get; steps in one stage
run in parallel (the two initializers), stages run in order. A directory stands in for
the PVC. Output lines are prefixed with the step's name; a failing step stops the run
with that step's one-line error (read from its termination log) and exit code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubetune import env
from kubetune.errors import StepFailedError


@dataclass
class Step:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class StepResult:
    name: str
    exit_code: int
    seconds: float
    error: str | None = None


_print_lock = threading.Lock()


def emit(line: str) -> None:
    """Write one line to stdout without interleaving with the steps' output."""
    _emit(line)


def _emit(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def _pump(name: str, pipe) -> None:
    for raw in iter(pipe.readline, b""):
        _emit(f"[{name}] {raw.decode('utf-8', 'replace').rstrip()}\n")


def run_process(step: Step, logs_dir: Path) -> StepResult:
    """Run one step to its end; its output goes to stdout prefixed with its name."""
    termination = logs_dir / f"{step.name}.termination-log"
    termination.unlink(missing_ok=True)
    child_env = {**os.environ, **step.env, env.TERMINATION_LOG: str(termination),
                 env.LOCAL_RUN: "1", "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    child = subprocess.Popen(step.command, env=child_env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    _pump(step.name, child.stdout)
    code = child.wait()
    error = None
    if code != 0:
        error = (termination.read_text().strip() if termination.is_file() else "") or \
            f"exited with code {code}"
    return StepResult(step.name, code, time.monotonic() - start, error)


def _run_one(step: Step, logs_dir: Path, results: dict[str, StepResult]) -> None:
    results[step.name] = run_process(step, logs_dir)


def run_stages(stages: list[list[Step]], logs_dir: Path) -> list[StepResult]:
    """Run ``stages`` in order (steps within one in parallel); raise on the first failure."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    finished: list[StepResult] = []
    for stage in stages:
        results: dict[str, StepResult] = {}
        threads = [threading.Thread(target=_run_one, args=(s, logs_dir, results)) for s in stage]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for step in stage:
            result = results[step.name]
            finished.append(result)
            status = "ok" if result.exit_code == 0 else f"FAILED (exit {result.exit_code})"
            _emit(f"==> {step.name}: {status} in {result.seconds:.1f}s\n")
        failed = [results[s.name] for s in stage if results[s.name].exit_code != 0]
        if failed:
            first = failed[0]
            # The step's own report already names it ("trainer: ..."): don't say it twice.
            cause = first.error.split(": ", 1)[1] if first.error.startswith(
                tuple(f"{n}:" for n in ("dataset-initializer", "model-initializer", "trainer",
                                        "exporter"))) else first.error
            raise StepFailedError(first.name, cause, first.exit_code)
    return finished
