"""Warn about ``KUBETUNE_*`` variables no part of kubetune reads: a typo such as
``KUBETUNE_EPOCH`` would otherwise be ignored without a word and the run would train with
the default the user meant to change."""

from __future__ import annotations

from typing import Mapping

from kubetune import env
from kubetune.suggest import closest


def known_names() -> set[str]:
    """Every ``KUBETUNE_*`` name kubetune/env.py defines (the one list of names)."""
    return {value for name, value in vars(env).items()
            if name.isupper() and isinstance(value, str)
            and value.startswith(env.KUBETUNE_PREFIX) and value != env.KUBETUNE_PREFIX}


def unknown_names(environ: Mapping[str, str]) -> list[str]:
    """One warning line per unknown ``KUBETUNE_*`` variable in ``environ``, with the known
    name it is closest to where there is one."""
    known = known_names()
    lines = []
    for name in sorted(environ):
        if name.startswith(env.KUBETUNE_PREFIX) and name not in known:
            guess = closest(name, known)
            hint = f" (did you mean {guess}?)" if guess else ""
            lines.append(f"unknown environment variable {name}{hint}: kubetune ignores it")
    return lines
