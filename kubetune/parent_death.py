"""A child process that the kernel kills when its parent dies (Linux ``PR_SET_PDEATHSIG``;
elsewhere nothing).

A step or a recipe runs in its own session so a stop can signal it as a group; without
this, a parent killed outright (SIGKILL, the OOM killer) would leave it running on,
unsupervised, holding its locks. The libc call is looked up at import, in the parent:
``die_with_parent`` runs as a ``preexec_fn`` between fork and exec of a threaded parent,
where an import (and the import lock another thread may hold) must not happen.
"""

from __future__ import annotations

import signal

_PR_SET_PDEATHSIG = 1


def _prctl():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the thread that started it ends (its
    parent's, as long as that thread waits for it)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
