"""Every violation a check finds, reported at once: one line each, then exit 65 once.

A file with three mistakes is fixed in one edit, not three runs: the CRD schema check
(`manifest_schema`), the runtime contract (`runtime_contract`), the settings' values
(`settings_check`) and the controller's admission rules (`runtime_merge`) each collect
every problem and raise them together as one ``ContractError``. The lines are sorted by
file and path; past ``SHOWN`` of them, the rest are counted, not printed.
"""

from __future__ import annotations

from kubetune.errors import BadInputError

# Lines printed before the rest are only counted (a file generated wrong can hold hundreds).
SHOWN = 20


class ContractError(BadInputError):
    """Violations, all of them: one line each (``lines``, sorted). Its message (what a
    caller that reports only one line shows) is every line joined."""

    def __init__(self, lines: list[str], sort: bool = True, message: str | None = None
                 ) -> None:
        self.lines = sorted(dict.fromkeys(lines)) if sort else list(dict.fromkeys(lines))
        super().__init__(message or "; ".join(self.lines))


def raise_all(lines: list[str]) -> None:
    """Raise ``lines`` as one ContractError, when there are any."""
    if lines:
        raise ContractError(lines)


def report(error: ContractError, step: str) -> int:
    """Each violation as its own `error: <step>: ` line (stderr, termination log, JSON
    lines where asked), as `run_step` reports one; past ``SHOWN``, a count; exit 65."""
    from kubetune.termination import report_failure

    for line in error.lines[:SHOWN]:
        report_failure(f"{step}: {line}")
    if len(error.lines) > SHOWN:
        report_failure(f"{step}: {len(error.lines) - SHOWN} more violations not shown "
                       f"({len(error.lines)} in all); fix these and run again")
    return error.exit_code
