"""The one place kubetune retries network calls.

Exponential backoff with full jitter, a bounded number of attempts and a bounded total
time; a server's ``Retry-After`` is honoured as asked, up to what is left of the total
budget. Callers say what is transient by raising `TransientFailure` (or passing
``classify``); anything else propagates at once, so 401/403/404 are never retried.

The budget bounds time spent failing, not time spent working: a caller that moves bytes
passes a `Progress` and reports how far it got, and an attempt that got further than any
before it starts the budget (attempts and time) afresh. A 20-minute download that drops once is retried; a
link that fails every attempt before the first byte gives up as before.

This loop is the only one: clients it wraps (botocore, huggingface_hub) are configured to
make single attempts, so N attempts here are N requests, not N x their own retries.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from kubetune import env
from kubetune.env_numbers import env_float, env_int
from kubetune.errors import TransientError

T = TypeVar("T")
log = logging.getLogger("retry")

class TransientFailure(Exception):
    """Raised inside a retried call: the failure is worth another attempt."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Progress:
    """How far the work of one `call` has got: a high-water mark (bytes of a file on
    disk, say), raised by the caller as data lands.

    A failed attempt that raised the mark restarts the budget. A mark, not a count:
    an attempt that moves bytes again without getting further (a checksum mismatch that
    starts the file over) is no progress, so a bounded transfer cannot retry forever.
    Thread-safe: parts of one file may land on several threads.
    """

    def __init__(self, start: int = 0) -> None:
        self._mark = start
        self._lock = threading.Lock()

    def reached(self, level: int) -> None:
        with self._lock:
            self._mark = max(self._mark, level)

    @property
    def mark(self) -> int:
        with self._lock:
            return self._mark


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 8
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    total_s: float = 600.0

    @classmethod
    def from_env(cls) -> "RetryPolicy":
        d = cls()
        return cls(
            max_attempts=env_int(env.RETRY_MAX_ATTEMPTS, d.max_attempts, minimum=1),
            base_delay_s=env_float(env.RETRY_BASE_DELAY_S, d.base_delay_s, minimum=0),
            max_delay_s=env_float(env.RETRY_MAX_DELAY_S, d.max_delay_s, minimum=0),
            total_s=env_float(env.RETRY_TOTAL_S, d.total_s, minimum=0),
        )

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            # The server knows when it will take the request again: earlier is refused
            # again. Only the total budget bounds it (checked by `call`).
            return max(retry_after, 0.0)
        return random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** attempt))


def call(func: Callable[[], T], what: str, policy: RetryPolicy | None = None,
         classify: Callable[[BaseException], TransientFailure | None] | None = None,
         sleep: Callable[[float], None] = time.sleep, progress: Progress | None = None) -> T:
    """Run ``func`` until it succeeds, a failure is not transient, or the budget runs out.

    ``classify`` maps an exception to a `TransientFailure` (retry) or None (re-raise).
    ``progress``, raised by ``func`` as its work gets further, restarts the budget after
    a failed attempt that raised it. When the budget is spent, `TransientError` says what kept
    failing.
    """
    policy = policy or RetryPolicy.from_env()
    start = time.monotonic()
    attempt = 0
    mark = progress.mark if progress else 0
    while True:
        try:
            return func()
        except TransientFailure as exc:
            failure = exc
        except Exception as exc:
            failure = classify(exc) if classify else None
            if failure is None:
                raise
        if progress and progress.mark > mark:
            # This attempt got further than any before it: the budget is for failing ones.
            mark, attempt, start = progress.mark, 0, time.monotonic()
        attempt += 1
        wait = policy.delay(attempt - 1, failure.retry_after)
        elapsed = time.monotonic() - start
        if attempt >= policy.max_attempts:
            raise TransientError(f"{what}: still failing after {attempt} attempts over "
                                 f"{elapsed:.0f}s: {failure}") from None
        if elapsed + wait > policy.total_s:
            asked = (f"; the server asked to wait {wait:.0f}s, past the "
                     f"{policy.total_s:.0f}s budget ({env.RETRY_TOTAL_S})"
                     if failure.retry_after is not None else "")
            raise TransientError(f"{what}: still failing after {attempt} attempts over "
                                 f"{elapsed:.0f}s: {failure}{asked}") from None
        log.warning("%s: %s; retry %d/%d in %.1fs", what, failure, attempt,
                    policy.max_attempts - 1, wait)
        sleep(wait)
