"""How a run of the recipe ended, as the launcher reports it: stopped by a signal
(resumable or not), a failure the recipe process recorded (its line and exit code, by the
exception's type), killed by a signal, or failed with its own error line."""

from __future__ import annotations

import collections
import re
import signal

from kubetune.errors import (EXIT_BAD_INPUT, EXIT_KILLED, EXIT_TRANSIENT, BadInputError,
                             KilledError, KubetuneError, TransientError)
from kubetune.restart_advice import restart_advice
from kubetune.trainer.checkpointing import resume
from kubetune.trainer.planning.plan import RunPlan
from kubetune.trainer.failures.failure_record import FailureRecord
from kubetune.trainer.launcher.supervision import RecipeRun

_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d*\]:\s*")
# torchrun's own report of a failed worker: the worker's exception says more.
_WRAPPER_ERRORS = ("ChildFailedError", "SignalException")
# What a signal that kills the recipe usually means, and what to do about it.
_SIGNAL_MEANINGS = {
    signal.SIGKILL: "likely the out-of-memory killer: raise the container's memory limit "
                    "or lower batch_size / tokenizer.max_seq_len",
    signal.SIGSEGV: "a crash in native code (torch, a driver)",
    signal.SIGBUS: "a bus error, often a full /dev/shm: enlarge the pod's shm volume",
    signal.SIGABRT: "an abort in native code (torch, a driver)",
    signal.SIGTERM: "terminated by another process",
}
# torchrun's report of a failed worker ("exitcode  : -9 (pid: 123)"; negative: a signal).
_TORCHRUN_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")
# A record's exit code -> the error that exits with it (anything else: internal, 70).
_ERRORS = {EXIT_BAD_INPUT: BadInputError, EXIT_TRANSIENT: TransientError,
           EXIT_KILLED: KilledError}


def was_stopped(plan_: RunPlan, ran: RecipeRun) -> bool:
    """Stopped by a signal (ours, or another node's: all ranks saved together, exit 75)
    rather than failed."""
    if ran.code == 0:
        return False
    if ran.signalled:
        return True
    record = resume.read_record(plan_.output_dir)
    path = plan_.output_dir / resume.RESUME_RECORD_NAME
    return (record is not None and record.reason == "signal"
            and record.fingerprint == plan_.fingerprint
            and path.stat().st_mtime >= ran.started_at)


def raise_stopped(plan_: RunPlan) -> None:
    """A stop is transient: say whether a restart resumes or starts over."""
    output_dir = plan_.output_dir
    record = resume.read_record(output_dir)
    if record is not None and record.fingerprint == plan_.fingerprint:
        raise TransientError(
            f"stopped by signal; resumable checkpoint {output_dir / record.checkpoint} "
            f"({record.epochs_run} epoch(s) + {record.steps_in_epoch} step(s)): "
            f"{restart_advice(resumes=True)}")
    raise TransientError(f"stopped by signal before any resumable checkpoint within the "
                         f"{plan_.grace_period_s:.0f} s grace period: "
                         f"{restart_advice(resumes=False)}")


def raise_failed(plan_: RunPlan, ran: RecipeRun) -> None:
    """The recipe's failure as one line: what its process recorded (a refused run, no
    fallback left, out of memory), else killed by a signal, else its own error line."""
    if ran.failure is not None:
        raise failure_error(ran.failure)
    signum = killing_signal(ran.code, ran.tail)
    if signum is not None:
        raise killed_error(signum, plan_.request.recipe)
    raise KubetuneError(f"recipe {plan_.request.recipe} failed: {error_line(ran.tail)}")


def failure_error(record: FailureRecord) -> KubetuneError:
    """The typed error a failure record stands for: its line, its exit code."""
    error = _ERRORS.get(record.exit_code, KubetuneError)(record.message)
    error.exit_code = record.exit_code
    return error


def killing_signal(code: int, tail: collections.deque) -> int | None:
    """The signal that killed the recipe, or under torchrun the worker that failed first
    (its report's root cause comes last; the workers torchrun then stopped come before)."""
    if code < 0:
        return -code
    for line in reversed(tail):
        match = _TORCHRUN_EXIT.search(line)
        if match:
            worker_code = int(match.group(1))
            return -worker_code if worker_code < 0 else None
    return None


def killed_error(signum: int, recipe: str) -> KilledError:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    meaning = _SIGNAL_MEANINGS.get(signum, "sent by the system or another process")
    return KilledError(f"recipe {recipe} was killed by signal {signum} ({name}), {meaning}; "
                       "a restart resumes from the last resumable checkpoint")


def error_line(tail: collections.deque) -> str:
    """The exception line of the recipe's traceback, else its last line."""
    for line in reversed(tail):
        text = _RANK_PREFIX.sub("", line)
        head = text.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head \
                and not head.endswith(_WRAPPER_ERRORS):
            return text
    return tail[-1] if tail else "the recipe exited without output"
