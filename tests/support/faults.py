"""What the test servers share: faults queued by tests, and every request recorded."""

from __future__ import annotations

import fnmatch
import threading
from typing import Callable


class FaultBook:
    """Faults a test queued (each for its next ``times`` matching requests), and the
    requests seen, behind one lock: server threads take, the test thread adds and reads."""

    fault_type: type  # a dataclass with kind, match, times and method fields

    def __init__(self) -> None:
        self.faults: list = []
        self.requests: list = []
        self._lock = threading.Lock()

    def fault(self, kind: str, match: str, times: int = 1, **options):
        fault = self.fault_type(kind=kind, match=match, times=times, **options)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.requests.clear()

    def _take(self, method: str, path: str, request=None,
              applies: Callable[[object], bool] = lambda fault: True):
        """Record ``request`` (if given) and spend the first fault matching this one."""
        with self._lock:
            if request is not None:
                self.requests.append(request)
            for fault in self.faults:
                if (fault.times > 0 and fault.method in (None, method) and applies(fault)
                        and fnmatch.fnmatch(path, fault.match)):
                    fault.times -= 1
                    return fault
        return None
