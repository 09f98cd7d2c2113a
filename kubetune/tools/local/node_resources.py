"""The trainer node's resources as the Kubeflow Trainer controller (v2.3) reads them.

- ``merge``: a TrainJob's ``resourcesPerNode`` over the runtime's node container
  (`pkg/runtime/core/trainingruntime.go` newRuntimeInfo, since #3602): a strategic merge,
  so limits and requests merge key by key and claims by name; what the TrainJob leaves
  out keeps the runtime's value (before #3602 the TrainJob's block replaced the runtime's
  whole, dropping its cpu and memory).
- ``gpus`` / ``cpus``: what the torch plugin counts for ``numProcPerNode: auto``
  (`runtime.GetNumGPUPerNode`, `torch.getNumCPUPerNode`): GPUs from requests, else limits;
  CPUs from requests, else limits; each quantity rounded up as ``Quantity.Value()``.
"""

from __future__ import annotations

import copy
import re

from kubetune import quantity
from kubetune.errors import BadInputError

_GPU = re.compile("gpu", re.IGNORECASE)


def _count(value: object) -> int:
    number = quantity.parse(value)
    if number is None:
        raise BadInputError(f"resource quantity {str(value)!r} is not a number")
    return quantity.whole(number)


def gpus(resources: dict | None) -> int:
    """GPUs per node: the first resource named like a GPU in requests, else in limits."""
    resources = resources or {}

    def count(section: dict | None) -> int:
        for name, value in (section or {}).items():
            if _GPU.search(name):
                return _count(value)
        return 0

    return count(resources.get("requests")) or count(resources.get("limits"))


def cpus(resources: dict | None) -> int:
    """CPUs per node: the request where one is set and not zero, else the limit; 0 where
    neither is (the torch plugin then starts one process)."""
    resources = resources or {}
    request = (resources.get("requests") or {}).get("cpu")
    if request is not None and _count(request) != 0:
        return _count(request)
    limit = (resources.get("limits") or {}).get("cpu")
    return _count(limit) if limit is not None else 0


def merge(base: dict | None, override: dict) -> dict:
    """``override`` (a TrainJob's resourcesPerNode) strategic-merged onto ``base`` (the
    runtime node container's resources)."""
    merged = copy.deepcopy(base or {})
    for section in ("limits", "requests"):
        if override.get(section):
            merged.setdefault(section, {}).update(copy.deepcopy(override[section]))
    claims = merged.get("claims") or []
    for claim in override.get("claims") or []:
        old = next((c for c in claims if c.get("name") == claim.get("name")), None)
        if old is None:
            claims.append(copy.deepcopy(claim))
        else:
            old.update(copy.deepcopy(claim))
    if claims:
        merged["claims"] = claims
    return merged
