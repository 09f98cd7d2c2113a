"""How many CPU cores this process may really use: the ones it is allowed to run on
(``sched_getaffinity``: a pod's cpuset), fewer when the container's CPU quota (a pod's CPU
limit, as CFS bandwidth) is smaller. ``os.cpu_count()`` counts the whole host's, and a pool
that size on a 4-core-limit pod of a 64-core node would only be throttled."""

from __future__ import annotations

import math
import os
from pathlib import Path

# cgroup v2 ("<quota> <period>" or "max <period>"), then v1 (two files; quota -1: none).
CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def _quota_cores() -> float | None:
    try:
        quota, period = CGROUP_V2_CPU_MAX.read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = CGROUP_V1_QUOTA.read_text().strip()
            period = CGROUP_V1_PERIOD.read_text().strip()
        except OSError:
            return None
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:  # "max": no quota
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def usable_cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _quota_cores()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)
