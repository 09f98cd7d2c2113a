"""The failure record: what a recipe process that failed for a known reason (a refused run,
no fallback left, out of memory) leaves for its launcher, so the launcher reports it by the
exception's type, not by matching names in the recipe's stderr, where a reworded message or
a wrapped exception would have become "internal error".

One small JSON file per rank (``failure-rank<N>.json``) in the directory the launcher names
in ``KUBETUNE_FAILURE_DIR``. The launcher makes that directory fresh for each run and
removes it after, so no earlier run's record is ever read; it reports the lowest rank's
record that reads back whole, and a missing or garbled one is no record (the launcher then
judges the exit as before: the killing signal, or the recipe's last error line)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kubetune.atomic_write import write_atomic

_PREFIX, _SUFFIX = "failure-rank", ".json"


@dataclasses.dataclass(frozen=True)
class FailureRecord:
    kind: str  # what failed, for logs and tests: no_step, non_finite, out_of_memory, ...
    message: str  # the user's one line
    exit_code: int  # what the launcher exits with (kubetune.errors' codes)


def record_path(directory: Path | str, rank: int) -> Path:
    """Where rank ``rank`` writes its record: each rank its own file, so two ranks failing
    together never write over each other."""
    return Path(directory) / f"{_PREFIX}{rank}{_SUFFIX}"


def write_failure_record(path: Path | str, record: FailureRecord) -> None:
    """Write ``record`` whole or not at all (the launcher may read it the moment the
    process exits); the file gets the mode the umask gives."""
    write_atomic(path, json.dumps(dataclasses.asdict(record)))


def read_failure_record(path: Path | str) -> FailureRecord | None:
    """The record at ``path``; None where there is none, or what is there is not a whole
    record (the launcher then trusts nothing in it)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    kind, message, code = data.get("kind"), data.get("message"), data.get("exit_code")
    if not (isinstance(kind, str) and kind and isinstance(message, str) and message.strip()
            and type(code) is int and 0 < code < 256):
        return None
    # One line, whatever the writer put in: it lands in the termination log.
    return FailureRecord(kind, " ".join(message.split()), code)


def first_failure(directory: Path | str) -> FailureRecord | None:
    """The lowest rank's readable record in ``directory`` (rank 0 speaks for the run where
    several ranks failed the same way)."""
    ranks = []
    for path in Path(directory).glob(f"{_PREFIX}*{_SUFFIX}"):
        number = path.name[len(_PREFIX):-len(_SUFFIX)]
        if number.isdigit():
            ranks.append(int(number))
    for rank in sorted(ranks):
        record = read_failure_record(record_path(directory, rank))
        if record is not None:
            return record
    return None
