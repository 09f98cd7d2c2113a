"""What a recipe process that fails tells its launcher, decided by the exception's type.

A refused run (``run_sanity``: no optimizer step, a non-finite loss or weights), a speed
default with no fallback left (``fallbacks.NoFallbackError``) and running out of memory are
the user's to fix: exit 65 with one line. The failure record
(``kubetune.trainer.failures.failure_record``) carries that line and code to the launcher,
found by type anywhere in the exception's chain (``raise X from refusal``, or an error
raised while handling one), so neither a reworded message nor a wrapper changes the report.
Anything else writes no record: the launcher reports it as an internal error, as before.
"""

from __future__ import annotations

import logging
import sys
from typing import Iterator

from kubetune.errors import EXIT_BAD_INPUT, BadInputError
from kubetune.trainer.failures.failure_record import (FailureRecord, record_path,
                                                      write_failure_record)
from kubetune.trainer.recipe_process import run_sanity
from kubetune.trainer.request import passed_env
from kubetune.trainer.recipe_process.fallbacks import NoFallbackError

log = logging.getLogger("trainer")

# The out-of-memory line says what to change; a restart would fail the same way.
_OUT_OF_MEMORY_ADVICE = ("lower batch_size or tokenizer.max_seq_len, set "
                         "enable_activation_checkpointing=True, or use method qlora / more "
                         "devices")
# torch's CPU allocator reports a failed allocation as a plain RuntimeError (c10::Error),
# with no type of its own: this phrase in the exception itself is all there is to know it by.
_CPU_ALLOCATOR_FAILED = "can't allocate memory"


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from or while handling, outermost first (the chain
    a traceback prints)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__
                                        else current.__context__)


def _out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")  # never imported here: no torch, no torch error
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if isinstance(oom, type) and isinstance(exc, oom):  # torch.cuda's is the same class
        return True
    return isinstance(exc, RuntimeError) and _CPU_ALLOCATOR_FAILED in str(exc)


def _exception_line(exc: BaseException) -> str:
    """``module.Type: first line``, as a traceback's last line names it."""
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" \
        else f"{cls.__module__}.{cls.__qualname__}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{name}: {lines[0]}" if lines else name


def bad_input(kind: str, message: str) -> FailureRecord:
    """A failure the user must fix (exit 65), its message on one line."""
    return FailureRecord(kind, " ".join(message.split()), EXIT_BAD_INPUT)


# The refusals, most specific first: their message is already the user's line.
_REFUSALS = ((run_sanity.NoStepError, "no_step"), (run_sanity.NonFiniteError, "non_finite"),
             (run_sanity.RunRefused, "refused"), (NoFallbackError, "no_fallback"),
             # A component of ours (the preference builder) refusing the user's data.
             (BadInputError, "bad_input"))


def _match(exc: BaseException) -> tuple[BaseException, FailureRecord] | None:
    """The outermost exception in ``exc``'s chain that calls for a record, and the record."""
    for link in chain(exc):
        for cls, kind in _REFUSALS:
            if isinstance(link, cls):
                return link, bad_input(kind, str(link))
        if _out_of_memory(link):
            return link, bad_input("out_of_memory", f"out of memory "
                                   f"({_exception_line(link)[:160]}): {_OUT_OF_MEMORY_ADVICE}")
    return None


def classify(exc: BaseException) -> FailureRecord | None:
    """The record ``exc`` calls for; None where it is no failure of the user's to fix."""
    found = _match(exc)
    return None if found is None else found[1]


def leave(record: FailureRecord) -> None:
    """Write this rank's record where the launcher reads it. Best effort: a record that
    cannot be written (a full /tmp) must not hide the failure it reports."""
    directory = passed_env.failure_dir()
    if directory is None:
        return
    try:
        write_failure_record(record_path(directory, passed_env.rank()), record)
    except OSError as exc:
        log.warning("could not write the failure record to %s: %s", directory, exc)


def report(exc: BaseException) -> BaseException | None:
    """Leave the record ``exc`` calls for, if any, and return the exception in its chain
    that the record reports (a ``run_sanity.RunRefused`` is printed as the user's line)."""
    found = _match(exc)
    if found is None:
        return None
    leave(found[1])
    return found[0]
