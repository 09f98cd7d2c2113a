"""Warm starts for the suite's torchtune and kubetune commands (tests/support/
warm_start_hook.py names them; warm_start_server.py says what a warm start leaves out).

``make test`` and ``make matrix-test`` write the venv's `.pth` line
(``python -m tests.support.warm_start --install``); each pytest process then starts one
server (``start``, from conftest) and names it in ``TESTS_WARM_START``, which every
process the suite starts inherits. Without the `.pth` (pytest run by hand) every command
starts cold, as a user's does. A test whose subject is a process's start (its import-time
output, a signal just after it starts, finding it among the machine's processes by its
command line) runs its command with ``cold(env)``.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ENV = "TESTS_WARM_START"
HOOK = Path(__file__).with_name("warm_start_hook.py")
SERVER = Path(__file__).with_name("warm_start_server.py")
PTH = Path(sysconfig.get_paths()["purelib"]) / "kubetune-tests-warm-start.pth"


def pth_line() -> str:
    # One line that costs an environment lookup when no server is named.
    return (f"import os; os.environ.get({ENV!r}) and os.path.isfile({str(HOOK)!r}) and "
            f"exec(compile(open({str(HOOK)!r}).read(), {str(HOOK)!r}, 'exec'), "
            f"{{'__name__': 'tests_warm_start_hook', '__file__': {str(HOOK)!r}}})\n")


def install() -> None:
    PTH.write_text(pth_line())


def installed() -> bool:
    return PTH.is_file() and PTH.read_text() == pth_line()


def cold(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the server: the command starts as a user's does."""
    return {k: v for k, v in env.items() if k != ENV}


def start() -> None:
    """One server for this process and every process it starts; gone when this one
    ends (its stdin closes)."""
    if ENV in os.environ or not installed():
        return
    scratch = Path(tempfile.mkdtemp(prefix="kt-warm-"))
    address = scratch / "socket"
    log = open(scratch / "server.log", "w")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    server = subprocess.Popen([sys.executable, "-P", str(SERVER), str(address)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                              env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while server.stdout.readline().strip() != b"ready":
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the warm-start server did not start: "
                               f"{(scratch / 'server.log').read_text()[-2000:]}")
    os.environ[ENV] = str(address)

    def stop() -> None:
        os.environ.pop(ENV, None)
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()

    atexit.register(stop)


if __name__ == "__main__" and sys.argv[1:] == ["--install"]:
    install()
