"""Read ClusterTrainingRuntime and TrainJob manifests from YAML files.

Only what `kubetune local --runtime` needs to run a runtime here: the documents as plain
dicts, with a one-line error naming the file for anything a user can get wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kubetune.errors import BadInputError
from kubetune.tools.local import manifest_schema

API_GROUP = "trainer.kubeflow.org"
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
TRAINJOB_KIND = "TrainJob"


def _load_one(path: Path, kinds: tuple[str, ...]) -> dict[str, Any]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except OSError as exc:
        raise BadInputError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise BadInputError(f"{path}: not valid YAML{where}") from None
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") in kinds]
    if len(found) != 1:
        raise BadInputError(f"{path}: expected exactly one {' or '.join(kinds)} document, "
                            f"found {len(found)}")
    doc = found[0]
    if not str(doc.get("apiVersion", "")).startswith(API_GROUP + "/"):
        raise BadInputError(f"{path}: apiVersion {doc.get('apiVersion')!r} is not "
                            f"{API_GROUP}/v1alpha1")
    if not (doc.get("metadata") or {}).get("name"):
        raise BadInputError(f"{path}: metadata.name is required")
    return doc


def load_runtime(path: Path) -> dict[str, Any]:
    """The (Cluster)TrainingRuntime in ``path``, checked for what running it needs."""
    doc = _load_one(Path(path), RUNTIME_KINDS)
    manifest_schema.check(doc, path)
    jobs = (((doc.get("spec") or {}).get("template") or {}).get("spec") or {}) \
        .get("replicatedJobs")
    if not jobs:
        raise BadInputError(f"{path}: spec.template.spec.replicatedJobs is empty")
    return doc


def load_trainjob(path: Path) -> dict[str, Any]:
    """The TrainJob in ``path``."""
    doc = _load_one(Path(path), (TRAINJOB_KIND,))
    manifest_schema.check(doc, path)
    if not ((doc.get("spec") or {}).get("runtimeRef") or {}).get("name"):
        raise BadInputError(f"{path}: spec.runtimeRef.name is required")
    return doc


def default_trainjob(runtime: dict[str, Any]) -> dict[str, Any]:
    """A TrainJob that only names ``runtime`` (everything else from the runtime)."""
    return {"apiVersion": f"{API_GROUP}/v1alpha1", "kind": TRAINJOB_KIND,
            "metadata": {"name": "local"},
            "spec": {"runtimeRef": {"name": runtime["metadata"]["name"],
                                    "kind": runtime["kind"]}}}
