"""One serving-venv process for a batch of checks (tests/support/serving_requests.py):
transformers, PEFT and torch imported once, not once per check; each base model loaded
once for all its exports. Requests go one at a time, from any thread."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

from tests.support.cli import REPO

SERVER = REPO / "tests/support/serving_requests.py"
# The serving venv's processes: no kubetune, no hub.
SERVING_ENV = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": "/tmp"}


class ServingSession:
    def __init__(self, python: Path, log: Path, timeout_s: float = 1200):
        self._log_path, self._timeout_s = log, timeout_s
        self._log = log.open("w")  # the libraries' warnings: read back on a failure
        self._process = subprocess.Popen([str(python), str(SERVER)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._log, text=True,
                                         env=SERVING_ENV)
        self._lock = threading.Lock()

    def __enter__(self) -> "ServingSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._process.stdin.closed:
            return
        self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()

    def request(self, request: dict) -> dict:
        """The server's answer: its report, or {"error": traceback} where the request
        raised. A server that ended (or hung past the timeout, and was killed) fails the
        caller with its log's tail."""
        with self._lock:
            timer = threading.Timer(self._timeout_s, self._process.kill)
            timer.start()
            try:
                self._process.stdin.write(json.dumps(request) + "\n")
                self._process.stdin.flush()
                line = self._process.stdout.readline()
            except BrokenPipeError:
                line = ""
            finally:
                timer.cancel()
        assert line, f"the serving process ended ({request.get('op')}):\n" \
                     + self._log_path.read_text()[-3000:]
        return json.loads(line)
