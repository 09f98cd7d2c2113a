"""Numbers read from environment variables: one parser, so every bad value reads the same.

A typo in a pod spec (``KUBETUNE_HTTP_TIMEOUT_S=60s``) is the user's to fix: it ends the
step with exit 65 and a line naming the variable, never a ValueError traceback (exit 70).
"""

from __future__ import annotations

import math
import os
from typing import Mapping

from kubetune.errors import BadInputError


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name)
    return value.strip() if value is not None and value.strip() else None


def env_int(name: str, default: int, minimum: int | None = None,
            environ: Mapping[str, str] | None = None) -> int:
    """``name`` as a whole number (``default`` when unset or empty); below ``minimum``: refused."""
    value = _raw(name, environ)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise BadInputError(f"{name}={value!r} is not a whole number (e.g. {name}={default})"
                            ) from None
    if minimum is not None and number < minimum:
        raise BadInputError(f"{name}={value!r} must be at least {minimum}")
    return number


def env_float(name: str, default: float, minimum: float | None = None,
              environ: Mapping[str, str] | None = None) -> float:
    """``name`` as a finite number of (say) seconds; below ``minimum``: refused."""
    value = _raw(name, environ)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise BadInputError(f"{name}={value!r} is not a number (e.g. {name}={default:g})")
    if minimum is not None and number < minimum:
        raise BadInputError(f"{name}={value!r} must be at least {minimum:g}")
    return number
