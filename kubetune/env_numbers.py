"""Numbers read from environment variables: one parser, so every bad value reads the same.

A typo in a pod spec (``KUBETUNE_HTTP_TIMEOUT_S=60s``) is the user's to fix: it ends the
step with exit 65 and a line naming the variable, never a ValueError traceback (exit 70).
So does a number out of its range (``minimum``, or ``above`` for a bound that is itself
refused): a worker count of 0 is not quietly taken as 1, an interval of 0 does not spin.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Mapping

from kubetune.errors import BadInputError


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    # The settings modules pass their own mapping; this process's environment otherwise.
    value = (os.environ if environ is None else environ).get(name)
    return value.strip() if value is not None and value.strip() else None


def _whole(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _finite(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _env_number(name: str, default, minimum, environ: Mapping[str, str] | None,
                parse: Callable[[str], int | float | None], kind: str,
                show: Callable[[int | float], str], above=None):
    value = _raw(name, environ)
    if value is None:
        return default
    number = parse(value)
    if number is None:
        raise BadInputError(f"{name}={value!r} is not {kind} (e.g. {name}={show(default)})")
    if minimum is not None and number < minimum:
        raise BadInputError(f"{name}={value!r} must be at least {show(minimum)}")
    if above is not None and number <= above:
        raise BadInputError(f"{name}={value!r} must be more than {show(above)}")
    return number


def env_int(name: str, default: int, minimum: int | None = None,
            environ: Mapping[str, str] | None = None) -> int:
    """``name`` as a whole number (``default`` when unset or empty); below ``minimum``: refused."""
    return _env_number(name, default, minimum, environ, _whole, "a whole number", str)


def env_float(name: str, default: float, minimum: float | None = None,
              environ: Mapping[str, str] | None = None, above: float | None = None) -> float:
    """``name`` as a finite number of (say) seconds; below ``minimum``, or not more than
    ``above``: refused."""
    return _env_number(name, default, minimum, environ, _finite, "a number",
                       lambda number: f"{number:g}", above)
