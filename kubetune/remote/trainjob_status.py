"""Progress into the TrainJob's status (Kubeflow Trainer 2.2+, feature gate TrainJobStatus).

The controller injects ``KUBEFLOW_TRAINER_SERVER_URL`` (HTTPS), ``..._CA_CERT`` (a CA file)
and ``..._TOKEN`` (a projected token *file*, rotated). We speak it as the kubeflow 0.5.0
SDK's ``update_trainjob_status`` does: POST the URL as given with
``{"trainerStatus": {"progressPercentage", "estimatedRemainingSeconds", "metrics":
[{"name", "value"}], "lastUpdatedTime"}}``, ``Authorization: Bearer <token>``, TLS verified
against the CA, at most one update per 5 s, at most 256 metrics, values as strings.

Reporting must never fail, block or slow a run: updates only replace the pending state
(the latest wins); one daemon thread sends it with bounded timeouts; failures cost one
warning line for the whole run, not one per step.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Mapping

from kubetune import env
from kubetune.redact import register_secret

log = logging.getLogger("kubetune.status")

MIN_INTERVAL_S = 5.0  # the SDK's throttle: the controller is not a metrics store
TIMEOUT_S = 5.0  # connect and read, per request
MAX_METRICS = 256


def status_payload(progress: int | None, eta_s: float | None,
                   metrics: Mapping[str, object] | None) -> dict:
    """The body the controller reads, with the SDK's clamps and string values."""
    status: dict = {"lastUpdatedTime": datetime.now(timezone.utc).isoformat()}
    if progress is not None:
        status["progressPercentage"] = max(0, min(100, int(progress)))
    if eta_s is not None:
        status["estimatedRemainingSeconds"] = max(0, int(round(eta_s)))
    if metrics:
        items = list(metrics.items())[:MAX_METRICS]
        status["metrics"] = [{"name": str(k), "value": str(v)} for k, v in items]
    return {"trainerStatus": status}


class _Token:
    """The projected token file, re-read whenever kubelet rotates it (new mtime or size)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._seen: tuple[float, int] | None = None
        self._value: str | None = None

    def value(self) -> str | None:
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
            if self._seen != (st.st_mtime, st.st_size):
                with open(self.path, encoding="utf-8") as f:
                    self._value = f.read().strip() or None
                self._seen = (st.st_mtime, st.st_size)
                register_secret(self._value)
        except OSError:
            return self._value  # mid-rotation: the last token is still the best guess
        return self._value


class StatusReporter:
    """Sends the latest progress to the TrainJob status endpoint from a daemon thread."""

    def __init__(self, url: str, ca_file: str | None, token_file: str | None,
                 source: str = "trainer", min_interval_s: float = MIN_INTERVAL_S,
                 timeout_s: float = TIMEOUT_S, warn: bool = True) -> None:
        self.url, self.source = url, source
        self.min_interval_s, self.timeout_s = min_interval_s, timeout_s
        self._token = _Token(token_file)
        self._ca_file = ca_file
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Condition()
        self._pending: dict | None = None
        self._urgent = False
        self._closed = False
        self._last_sent = float("-inf")
        self._warned = not warn
        self._done: tuple[dict | None, bool] = (None, False)  # last body sent, taken?
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="trainjob-status", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, source: str = "trainer",
                 warn: bool = True) -> "StatusReporter | None":
        """A reporter when the controller injected the endpoint; else None (no reporting)."""
        # The one reader of the three variables the controller injects for the status.
        environ = os.environ if environ is None else environ
        url = environ.get(env.TRAINER_SERVER_URL)
        if not url:
            return None
        return cls(url, environ.get(env.TRAINER_SERVER_CA_CERT),
                   environ.get(env.TRAINER_SERVER_TOKEN), source=source, warn=warn)

    def update(self, progress: int | None, eta_s: float | None = None,
               metrics: Mapping[str, object] | None = None) -> None:
        """Replace what the next send carries; returns at once."""
        with self._lock:
            self._pending = status_payload(progress, eta_s, metrics)
            self._lock.notify()

    def finish(self, progress: int | None = 100, eta_s: float | None = 0,
               metrics: Mapping[str, object] | None = None) -> bool:
        """Send this last state now (past the throttle) and wait for it, at most one
        request's timeout; stop the thread. True if the server took it."""
        with self._lock:
            final = self._pending = status_payload(progress, eta_s, metrics)
            self._urgent = True
            self._lock.notify()
            deadline = time.monotonic() + self.timeout_s + 1
            # Wait for the final state itself, not for an update already in flight.
            while self._done[0] is not final and time.monotonic() < deadline:
                self._lock.wait(max(0.0, deadline - time.monotonic()))
            self._closed = True
            self._lock.notify()
            return self._done[0] is final and self._done[1]

    def close(self) -> None:
        """Stop without waiting: whatever is pending is dropped."""
        with self._lock:
            self._closed = True
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    if self._pending is not None:
                        wait = 0.0 if self._urgent else \
                            self._last_sent + self.min_interval_s - time.monotonic()
                        if wait <= 0:
                            break
                        self._lock.wait(wait)
                    else:
                        self._lock.wait()
                body, self._pending, self._urgent = self._pending, None, False
                self._last_sent = time.monotonic()
            ok = self._send(body)
            with self._lock:
                self.sent += ok
                self._done = (body, ok)
                self._lock.notify_all()

    def _ssl_context(self) -> ssl.SSLContext:
        if self._context is None:
            ca = self._ca_file if self._ca_file and os.path.isfile(self._ca_file) else None
            self._context = ssl.create_default_context(cafile=ca)
        return self._context

    def _send(self, body: dict) -> bool:
        try:
            token = self._token.value()
            if not token:
                raise OSError(f"no token in {self._token.path or '(unset)'} "
                              f"({env.TRAINER_SERVER_TOKEN})")
            request = urllib.request.Request(
                self.url, data=json.dumps(body).encode(), method="POST",
                headers={"Authorization": f"Bearer {token}",
                         "Content-Type": "application/json"})
            context = self._ssl_context() if self.url.startswith("https:") else None
            with urllib.request.urlopen(request, timeout=self.timeout_s,
                                        context=context) as response:
                response.read(65536)
                if response.status != 200:
                    raise OSError(f"HTTP {response.status}")
        except urllib.error.HTTPError as exc:
            return self._failed(f"HTTP {exc.code}")
        except Exception as exc:  # any failure here only costs the status, never the run
            reason = getattr(exc, "reason", None) or exc
            return self._failed(f"{type(exc).__name__}: {reason}")
        return True

    def _failed(self, reason: str) -> bool:
        if not self._warned:
            self._warned = True
            # Once per run: a step-rate of warnings would bury the log.
            log.warning("TrainJob status: cannot report progress (%s); the %s goes on and "
                        "retries quietly", reason, self.source)
        return False


def transfer_metrics(step: str, have: int, total: int, files_done: int, files: int
                     ) -> dict[str, object]:
    """An initializer's (or exporter's) numbers as status metrics. No progressPercentage:
    the TrainJob's progress is the training's, which a download must not reset."""
    percent = 100.0 * have / total if total else 100.0
    return {"phase": step, "transfer_bytes": have, "transfer_total_bytes": total,
            "transfer_percent": f"{min(100.0, percent):.1f}", "transfer_files": files_done,
            "transfer_total_files": files}
