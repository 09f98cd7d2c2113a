"""What every step's entrypoint shares: logging, and turning failures into one line.

Configuration is resolved the same way everywhere, by click: a command-line option wins,
then its environment variable (``envvar=``), then the default.
"""

from __future__ import annotations

import functools
import sys
import traceback
from typing import Callable, TypeVar

from kubetune import logs
from kubetune.errors import EXIT_INTERNAL, KubetuneError
from kubetune.redact import redact, redact_std_streams
from kubetune.termination import report_failure

F = TypeVar("F", bound=Callable)


def run_step(step: str, func: Callable[[], int | None]) -> int:
    """Run ``func`` as step ``step``; map failures to a one-line report and an exit code."""
    redact_std_streams()  # before logging binds sys.stderr
    logs.setup(step)
    try:
        return func() or 0
    except KubetuneError as exc:
        report_failure(f"{step}: {exc.message}")
        return exc.exit_code
    except KeyboardInterrupt:
        report_failure(f"{step}: interrupted")
        return 130
    except Exception as exc:  # a bug: keep the traceback for the report, one line for the user
        # Frames quote the failing line and the exception its arguments (a URL, a header).
        print(redact(traceback.format_exc()), end="", file=sys.stderr, flush=True)
        first = str(exc).splitlines()[0] if str(exc) else ""
        report_failure(f"{step}: internal error: {type(exc).__name__}: {first}")
        return EXIT_INTERNAL


def step_command(step: str) -> Callable[[F], F]:
    """Decorate a click command body so it runs as ``step`` and exits with its code."""

    def wrap(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            code = run_step(step, lambda: func(*args, **kwargs))
            sys.exit(code)

        return wrapper  # type: ignore[return-value]

    return wrap
