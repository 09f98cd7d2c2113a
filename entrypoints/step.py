"""What every step's entrypoint shares: logging, and turning failures into one line.

Configuration is resolved the same way everywhere, by click: a command-line option wins,
then its environment variable (``envvar=``), then the default.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
import traceback
from typing import Callable, TypeVar

from kubetune import __version__, logs
from kubetune.entrypoints import early_sigterm
from kubetune.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, KubetuneError
from kubetune.redact import redact, redact_std_streams, register_secret, url_credentials
from kubetune.termination import report_failure
from kubetune.unknown_env import unknown_names

F = TypeVar("F", bound=Callable)


def run_step(step: str, func: Callable[[], int | None]) -> int:
    """Run ``func`` as step ``step``; map failures to a one-line report and an exit code."""
    redact_std_streams()  # before logging binds sys.stderr
    # A URL's user and password inside an argument (a trainer override) are secrets as
    # those of the environment are: masked wherever they surface, cut or rewritten.
    for part in url_credentials(" ".join(sys.argv[1:])):
        register_secret(part)
    early_sigterm.install(step)  # names the step; a step with its own handling replaces it
    problem = logs.settings_problem()
    if problem is not None:
        report_failure(f"{step}: {problem}")
        return EXIT_BAD_INPUT
    log = logs.setup(step)
    # For a bug report (-v): what ran, and which of our variables were set (names only:
    # values may be secrets). The whole environment is scanned, as just below.
    log.debug("kubetune %s, python %s; set: %s", __version__, sys.version.split()[0],
              ", ".join(sorted(n for n in os.environ if n.startswith("KUBETUNE_"))) or "none")
    # The whole environment, not one value: which KUBETUNE_* names no part of us reads.
    for line in unknown_names(os.environ):
        log.warning(line)
    try:
        return func() or 0
    except KubetuneError as exc:
        report_failure(f"{step}: {exc.message}")
        return exc.exit_code
    except KeyboardInterrupt:
        report_failure(f"{step}: interrupted")
        return 130
    except OSError as exc:
        message = volume_full(exc) or path_error(exc)
        if message is None:
            return _internal(step, exc)
        report_failure(f"{step}: {message}")
        return EXIT_BAD_INPUT
    except Exception as exc:
        return _internal(step, exc)


# What a path the user gave (or the pod's mounts) can do to any file operation: no
# permission, a read-only volume, a file where a directory belongs or the reverse. A
# restart fails the same way; the fix is the path, the mount or the securityContext.
_PATH_ERRNOS = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                errno.EROFS: "read-only file system", errno.ENOTDIR: "not a directory",
                errno.EISDIR: "is a directory", errno.EEXIST: "already exists"}


def volume_full(exc: OSError) -> str | None:
    """One line for a full volume or an exceeded quota, wherever a step writes: a restart
    fails the same way until the volume has room, so it is the user's to fix (exit 65)."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = f" writing {exc.filename}" if exc.filename else ""
    what = "quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
    return (f"volume full ({what}{where}): enlarge the volume (PVC) or free space on it, "
            "then run again")


def path_error(exc: OSError) -> str | None:
    """One line for an OSError a path causes, naming the path; None for any other."""
    if exc.errno not in _PATH_ERRNOS or not exc.filename:
        return None
    what = _PATH_ERRNOS[exc.errno]
    fix = {errno.ENOTDIR: "a part of it is a file: point at a directory",
           errno.EISDIR: "point at a file, not a directory",
           errno.EEXIST: "remove it or choose another path",
           errno.EROFS: "mount the volume read-write or choose another path"}.get(
        exc.errno, "fix its permissions, or the pod's securityContext (runAsUser, fsGroup)")
    return f"{exc.filename}: {what}: {fix}"


def _internal(step: str, exc: BaseException) -> int:
    """A bug: keep the traceback for the report, one line for the user."""
    # Frames quote the failing line and the exception its arguments (a URL, a header).
    print(redact("".join(traceback.format_exception(exc))), end="", file=sys.stderr,
          flush=True)
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
