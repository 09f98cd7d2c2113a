"""Write ``crd_schemas.json``: the parts of Kubeflow Trainer's CRD schemas that
`kubetune local` checks a TrainJob and a runtime against, as `kubectl apply` does.

The CRDs are upstream's (`config/crd/bases` of kubeflow/trainer); the shipped file is cut
from them here, never fetched at run time. After a CRD update:

    python -m kubetune.tools.local.crd_schema_gen ../shared/crds

(`tests/test_trainjob_strict.py` fails while the shipped file and the CRDs differ.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CRD_FILES = {
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
}
SCHEMA_FILE = Path(__file__).with_name("crd_schemas.json")

# The schema keywords the check reads (descriptions, formats, CEL rules and list types are
# left out: the admission rules are `admission.py`'s).
_KEPT = ("type", "required", "enum", "nullable", "x-kubernetes-int-or-string",
         "x-kubernetes-preserve-unknown-fields")


def _cut(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: schema[k] for k in _KEPT if k in schema}
    if "properties" in schema:
        out["properties"] = {name: _cut(sub) for name, sub in schema["properties"].items()}
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _cut(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = _cut(schema["items"])
    return out


def schemas(crd_dir: Path) -> dict[str, Any]:
    """The cut schema of each kind's storage version, read from ``crd_dir``."""
    import yaml

    out = {}
    for kind, name in CRD_FILES.items():
        crd = yaml.safe_load((crd_dir / name).read_text())
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        out[kind] = {"version": version["name"],
                     "schema": _cut(version["schema"]["openAPIV3Schema"])}
    return out


def render(crd_dir: Path) -> str:
    """The file's text: sorted, a value a line, so a CRD change is a plain diff."""
    return json.dumps(schemas(crd_dir), sort_keys=True, indent=0) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(render(Path(sys.argv[1])))
    print(f"wrote {SCHEMA_FILE}")
