"""`kubetune` commands run in a process forked from a warm one, for tests whose subject is
what a command does, not how a process starts.

A `kubetune export` process spends most of its CPU importing torch for the logits check
(seconds each; the exporter's tests ran about 40 of them). ``kubetune_warm`` runs the
command in a child forked from a process that has imported torch already
(tests/support/warm_cli_server.py): its own process, environment, working directory,
umask, stdout, stderr, exit code and termination log, as `tests.support.cli.kubetune`
gives them, only without torch's import. What a child does not show is what happens at
interpreter start: the libraries' import-time warnings (test_export_local's
``TORCHAO_NOISE``) and a process's signals and death are tested with `kubetune` itself.

One warm process per pytest process, started on first use and ended with it.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.support.cli import REPO, clean_env

_START_TIMEOUT_S = 300  # torch's import on a loaded 2-core machine: a minute or more


class WarmServer:
    def __init__(self) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="kubetune-warm-cli-"))
        self.log = self.scratch / "server.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.warm_cli_server"], cwd=REPO,
                env=clean_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                bufsize=0)
        self.pending = b""  # answer bytes read past the last whole line
        self._read(_START_TIMEOUT_S)  # {"ready": true}

    def _read(self, timeout: float) -> dict:
        """The next answer line (read by hand: a file object's buffer could hold the
        line that select waits for)."""
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the warm kubetune process ended (exit "
                                   f"{self.process.wait()}): {self.log.read_text()[-3000:]}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, module: str, args: list[str], env: dict[str, str], cwd: Path,
            timeout: float, umask: int) -> subprocess.CompletedProcess:
        out, err = self.scratch / "stdout", self.scratch / "stderr"
        self.process.stdin.write(json.dumps({
            "module": module, "args": args, "env": env, "cwd": str(cwd), "umask": umask,
            "stdout": str(out), "stderr": str(err)}).encode() + b"\n")
        pid = self._read(60)["pid"]
        try:
            code = self._read(timeout)["exit"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._read(60)
            raise subprocess.TimeoutExpired([module, *args], timeout,
                                            out.read_text(errors="replace"),
                                            err.read_text(errors="replace")) from None
        # Decoded as subprocess.run(text=True) decodes a pipe.
        return subprocess.CompletedProcess([module, *args], code, out.read_text(),
                                           err.read_text())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for path in (self.scratch / "stdout", self.scratch / "stderr", self.log):
            path.unlink(missing_ok=True)
        self.scratch.rmdir()


_SERVER: list[WarmServer] = []
_LOCK = threading.Lock()


def run_warm(module: str, *args: str, env: dict[str, str] | None = None,
             cwd: Path | None = None, timeout: float = 600, umask: int = -1
             ) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` as tests/support/cli.py runs it, in a child of the warm
    process."""
    with _LOCK:
        if not _SERVER or _SERVER[0].process.poll() is not None:
            _SERVER[:] = [WarmServer()]
            atexit.register(_SERVER[0].stop)
        return _SERVER[0].run(module, list(args), env or clean_env(), cwd or REPO, timeout,
                              umask)


def kubetune_warm(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                  timeout: float = 600, umask: int = -1) -> subprocess.CompletedProcess:
    """`tests.support.cli.kubetune`, run in a child of the warm process."""
    return run_warm("kubetune.entrypoints", *args, env=env, cwd=cwd, timeout=timeout,
                    umask=umask)
