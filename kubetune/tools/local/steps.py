"""Run pipeline steps on this machine the way a JobSet runs them in a cluster.

Each step is its own process with the environment its pod would get; steps in one stage
run in parallel (the two initializers), stages run in order. A directory stands in for
the PVC. Output lines are prefixed with the step's name; a failing step stops the run
with that step's one-line error (read from its termination log) and exit code.

Signals: each step runs in its own process group, as a container has its own PID 1, so a
terminal's Ctrl-C does not hit every process at once. A SIGTERM, SIGINT (Ctrl-C) or SIGHUP
(the terminal closed) to `kubetune local` reaches every running step as the kubelet's
SIGTERM on eviction, which each step handles as it would in a pod (an initializer exits
75 at once, the trainer saves a resumable checkpoint within its grace period and exits
75); no further step starts, and `kubetune local` exits with the stopped step's own code.
A second signal kills the running steps, as the kubelet does after the grace period. A
step killed by a signal N (SIGKILL from the OOM killer, say) exits 128 + N, as
Kubernetes reports it, with a line naming the signal; so does a container step whose
engine reports 128 + N (`signal_report`).

However `kubetune local` ends, no step outlives it: the steps are signalled before
anything is printed (the terminal or the pipe may be gone: `| tee` dies with the same
Ctrl-C), output that cannot be written is dropped without stopping anything, a way out
that leaves steps running (an exception) stops them first, and a `kill -9` of `kubetune
local` takes its steps with it (the kernel's parent-death signal).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from kubetune import env, logs
from kubetune.errors import StepFailedError
from kubetune.parent_death import die_with_parent


@dataclass
class Step:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # The command is an engine client (`podman run`): the container's death by signal N
    # comes back as exit code 128 + N, not as the client's own death.
    in_container: bool = False


@dataclass
class StepResult:
    name: str
    exit_code: int
    seconds: float
    error: str | None = None


# Re-entrant: the signal handler prints from the main thread, which may hold it already.
_print_lock = threading.RLock()
# The steps running now, and the ones already sent the stop signal. Touched by the step
# threads and by the signal handler (main thread); set/dict operations are atomic.
_running: dict[int, subprocess.Popen] = {}
_signalled: set[int] = set()
_stop_signal: int | None = None
_stdout_gone = False
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What a step is sent for any stop: the kubelet's signal, the one every step handles.
STEP_STOP_SIGNAL = signal.SIGTERM
# How long a way out that is no stop (an exception, an exit) waits for the steps it
# stops before it kills them: the trainer's default grace period, the kubelet's default.
EXIT_GRACE_S = 30.0


def signal_exit_code(signum: int) -> int:
    """What a shell and Kubernetes report for a process killed by ``signum``."""
    return 128 + signum


def signal_of(returncode: int, in_container: bool = False) -> int | None:
    """The signal that ended a step, if one did: a process's negative returncode; for a
    container, the 128 + N its engine reports (the engine's own failures are 125-127)."""
    if returncode < 0:
        return -returncode
    if in_container and 128 < returncode <= 128 + 64:
        return returncode - 128
    return None


def signal_report(signum: int) -> str:
    """What a step ended by ``signum`` is reported as, the same for a process and a
    container: the signal's name and the exit code Kubernetes would show."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum == signal.SIGKILL:
        return f"killed by {name} (exit {signal_exit_code(signum)}): the OOM killer, or a " \
            "kill from outside"
    return f"stopped by {name} (exit {signal_exit_code(signum)})"


def stop_requested() -> int | None:
    """The signal that asked the run to stop, if one did: start nothing more."""
    return _stop_signal


# What the user did, where a signal's name alone would not say it.
_USER_SIGNALS = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGHUP: "SIGHUP (the terminal closed)"}


def user_signal_name(signum: int) -> str:
    return _USER_SIGNALS.get(signum, signal.Signals(signum).name)


def status_text(result: StepResult) -> str:
    """A finished step's word on its `==> name: ...` line: a step that ended because the
    run was stopped is stopped, not failed."""
    if result.exit_code == 0:
        return "ok"
    stopped = stop_requested()
    if stopped is not None:
        return f"stopped by {user_signal_name(stopped)} (exit {result.exit_code})"
    return f"FAILED (exit {result.exit_code})"


def stopped_cause(cause: str) -> str:
    """A step's own line, when the user's signal stopped the run: it names the signal
    `kubetune local` forwarded for the user's (the kubelet's SIGTERM, or the step's generic
    "signal"), so the user's own takes its place; else the user's leads."""
    stopped = stop_requested()
    if stopped is None:
        return cause
    user = f"stopped by {user_signal_name(stopped)}"
    forwarded = re.match(rf"stopped by (signal|{STEP_STOP_SIGNAL.name})\b", cause)
    return user + cause[forwarded.end():] if forwarded else f"{user}: {cause}"


def _signal_step(pid: int, signum: int) -> None:
    if pid in _signalled:
        return
    _signalled.add(pid)
    try:
        os.killpg(pid, signum)  # the step's own group: its leader and helpers, not others
    except ProcessLookupError:
        pass


def _kill_steps() -> None:
    for pid in list(_running):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _forward(signum: int, frame=None) -> None:
    global _stop_signal
    # The steps first, the words after: printing can fail or block (a reader gone).
    if _stop_signal is not None:
        # A second signal: whoever sent it will not wait for the saves; kill the steps,
        # as the kubelet does when the grace period is over.
        _kill_steps()
        _emit(own_line("==> a second signal: killed the running steps", "WARNING"),
              wait=False)
        return
    _stop_signal = signum
    for pid in list(_running):
        _signal_step(pid, STEP_STOP_SIGNAL)
    _emit(own_line(f"==> {signal.Signals(signum).name}: stopping the running steps",
                   "WARNING"), wait=False)


def stop_remaining_steps(grace_s: float = EXIT_GRACE_S) -> None:
    """Stop every step still running, as a stop signal would, then kill what is left
    after ``grace_s``: what `kubetune local` does on its way out, however it leaves."""
    running = list(_running.items())
    if not running:
        return
    for pid, _ in running:
        _signal_step(pid, STEP_STOP_SIGNAL)
    deadline = time.monotonic() + grace_s
    for pid, child in running:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    _kill_steps()


@contextlib.contextmanager
def forwarding_signals() -> Iterator[None]:
    """While the block runs, SIGTERM / SIGINT / SIGHUP stop the running steps (see module
    doc); however the block ends, it leaves no step running."""
    previous = {s: signal.signal(s, _forward) for s in FORWARDED_SIGNALS}
    # Also at interpreter exit, for a way out that skips the block's end.
    atexit.unregister(stop_remaining_steps)
    atexit.register(stop_remaining_steps)
    try:
        yield
    finally:
        try:
            stop_remaining_steps()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def emit(line: str, raw: bool = False) -> None:
    """Write one line to stdout without interleaving with the steps' output; a stdout
    that is gone (a closed pipe or terminal) drops it. With KUBETUNE_LOG_FORMAT=json each
    of its lines becomes a JSON object (``raw``: a document asked for, printed as is)."""
    if logs.json_mode() and not raw:
        line = "".join(_as_json(text) for text in line.splitlines() if text.strip())
    _emit(line)


def _as_json(text: str) -> str:
    if text.startswith("{"):
        return text + "\n"
    level = "WARNING" if text.startswith("warning: ") else "INFO"
    return own_line(text.removeprefix("warning: "), level)


def _emit(line: str, wait: bool = True) -> None:
    global _stdout_gone
    # From the signal handler, never wait on a writer stuck on a full pipe: the line is
    # the least of what a stop does.
    if not _print_lock.acquire(timeout=-1 if wait else 1.0):
        return
    try:
        if _stdout_gone:
            return
        sys.stdout.write(line)
        sys.stdout.flush()
    except RuntimeError:
        pass  # a signal handler's line interrupted a write of this thread: dropped
    except (OSError, ValueError):
        # The reader went away (`| head -1`, `| tee` killed by the same Ctrl-C: EPIPE; a
        # closed terminal: EIO) or stdout was closed. The run goes on, its output nowhere.
        _stdout_gone = True
        _discard(sys.stdout)
    finally:
        _print_lock.release()


def _discard(stream) -> None:
    """Point ``stream``'s file descriptor at /dev/null: what is still buffered, and
    whatever prints later (the summary, the interpreter's last flush), goes nowhere
    instead of failing."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def flush_or_discard_output() -> None:
    """Flush stdout and stderr before exiting; one whose reader is gone (`2>&1 | tee`
    killed by the Ctrl-C) is discarded: the interpreter's own last flush would fail on it
    and turn the exit code into 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            _discard(stream)


def own_line(message: str, level: str = "INFO", **fields: object) -> str:
    """A line of kubetune local's own (``==>``, the summary): text as it reads, or, with
    KUBETUNE_LOG_FORMAT=json, one JSON object whose message is the text without its
    ``==> ``."""
    if not logs.json_mode():
        return message + "\n"
    return logs.json_line("local", level, message.removeprefix("==> "), fields) + "\n"


def step_line(name: str, text: str) -> str:
    """A step's output line as kubetune local prints it: ``[name] `` before it, or, in
    JSON mode, the step's own JSON object (a line it printed otherwise wrapped in one)
    with the step named in it."""
    if not logs.json_mode():
        return f"[{name}] {text}\n"
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return logs.json_line(name, "INFO", text, {"step": name, "source": "output"}) + "\n"
    record.setdefault("step", name)
    return json.dumps(record, default=str) + "\n"


def _pump(name: str, pipe) -> None:
    for raw in iter(pipe.readline, b""):
        _emit(step_line(name, raw.decode("utf-8", "replace").rstrip()))


def termination_log(logs_dir: Path, name: str) -> Path:
    """The host file that holds step ``name``'s termination message."""
    return logs_dir / f"{name}.termination-log"


def run_process(step: Step, logs_dir: Path) -> StepResult:
    """Run one step to its end; its output goes to stdout prefixed with its name."""
    termination = termination_log(logs_dir, step.name)
    # Empty, not absent: a container step has this file bind-mounted, which needs it to
    # exist; its container runs as this user (`container_user`), who may write it.
    termination.write_text("")
    # A step's process inherits this shell's environment, as a pod inherits its image's.
    # PYTHONSAFEPATH: `python -m kubetune...` from a folder holding a clone named
    # `kubetune` would import the clone's directory as the package, not the installed one.
    child_env = {**os.environ, **step.env, env.TERMINATION_LOG: str(termination),
                 env.LOCAL_RUN: "1", env.PYTHONUNBUFFERED: "1", env.PYTHONSAFEPATH: "1"}
    start = time.monotonic()
    stopped = stop_requested()
    if stopped is not None:
        return StepResult(step.name, signal_exit_code(stopped), 0.0,
                          f"not started: kubetune local was stopped by "
                          f"{signal.Signals(stopped).name}")
    # die_with_parent: a `kill -9` of `kubetune local` takes the step with it (this
    # thread waits for the step, so it outlives it otherwise).
    child = subprocess.Popen(step.command, env=child_env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, preexec_fn=die_with_parent)
    _running[child.pid] = child
    stopped = stop_requested()
    if stopped is not None:  # the signal came while this step was starting
        _signal_step(child.pid, STEP_STOP_SIGNAL)
    try:
        _pump(step.name, child.stdout)
        code = child.wait()
    finally:
        _running.pop(child.pid, None)
    error = None
    message = termination.read_text().strip() if termination.is_file() else ""
    signum = signal_of(code, step.in_container)
    # A process killed by a signal wrote no termination log; a container's step that
    # wrote one and exited 128 + N on its own said more than the signal's name would.
    if signum is not None and not (code > 0 and message):
        code = signal_exit_code(signum)
        error = signal_report(signum)
    elif code != 0:
        error = message or f"exited with code {code}"
    return StepResult(step.name, code, time.monotonic() - start, error)


def _run_one(step: Step, logs_dir: Path, results: dict[str, StepResult]) -> None:
    results[step.name] = run_process(step, logs_dir)


def run_stages(stages: list[list[Step]], logs_dir: Path) -> list[StepResult]:
    """Run ``stages`` in order (steps within one in parallel); raise on the first failure."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    finished: list[StepResult] = []
    for stage in stages:
        stopped = stop_requested()
        if stopped is not None:  # every step so far finished: the next ones never start
            raise StepFailedError(stage[0].name, f"not started: kubetune local was stopped by "
                                  f"{signal.Signals(stopped).name}", signal_exit_code(stopped))
        results: dict[str, StepResult] = {}
        threads = [threading.Thread(target=_run_one, args=(s, logs_dir, results)) for s in stage]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for step in stage:
            result = results[step.name]
            finished.append(result)
            _emit(own_line(f"==> {step.name}: {status_text(result)} in "
                           f"{result.seconds:.1f}s", "INFO" if result.exit_code == 0
                           else "ERROR", step=step.name, exit_code=result.exit_code,
                           seconds=round(result.seconds, 1)))
        failed = [results[s.name] for s in stage if results[s.name].exit_code != 0]
        if failed:
            first = failed[0]
            # The step's own report already names it ("trainer: ..."): don't say it twice.
            cause = first.error.split(": ", 1)[1] if first.error.startswith(
                tuple(f"{n}:" for n in ("dataset-initializer", "model-initializer", "trainer",
                                        "exporter"))) else first.error
            raise StepFailedError(first.name, stopped_cause(cause), first.exit_code)
    return finished
