"""Where a runtime's replicatedJobs and containers are, and how a line names them
(``replicatedJobs[node].template.spec.template.spec.containers[node]``): shared by the
runtime contract and the settings check, over plain dicts that may be malformed (each
check reports what it finds; the schema check reports the shape)."""

from __future__ import annotations

from typing import Iterator

POD = "template.spec.template.spec"


def jobs(runtime: dict) -> list:
    """A runtime's replicatedJobs ([] where there are none or not a list)."""
    spec = ((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}
    found = spec.get("replicatedJobs")
    return found if isinstance(found, list) else []


def pod(rjob: dict) -> dict:
    """A replicatedJob's pod spec ({} where it has none)."""
    return ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {})
            .get("spec") or {})


def containers(rjob: dict) -> Iterator[tuple[str, int, dict]]:
    """(initContainers or containers, index, container) of each container of a job."""
    spec = pod(rjob)
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or []):
            if isinstance(container, dict):
                yield kind, i, container


def job_ref(rjob: dict, index: int) -> str:
    """A job as a line names it: by its name, else its index."""
    return f"replicatedJobs[{rjob.get('name') or index}]"


def container_ref(rjob: dict, index: int, kind: str, i: int, container: dict) -> str:
    """A container as a line names it: its job's path, then its name (else its index)."""
    return f"{job_ref(rjob, index)}.{POD}.{kind}[{container.get('name') or i}]"
