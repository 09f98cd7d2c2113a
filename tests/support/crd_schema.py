"""Validate a manifest against a CRD's openAPIV3Schema as the API server would on create.

- Unknown fields are errors (the server prunes them silently from structural schemas,
  which would drop a misspelt field without a word: `kubectl apply --validate=strict`
  reports them, and so do we).
- `x-kubernetes-int-or-string` and `x-kubernetes-preserve-unknown-fields` as Kubernetes
  reads them.
- `x-kubernetes-validations` CEL rules evaluated with cel-python; transition rules (those
  naming `oldSelf`) only run on update, so on create they are skipped.
- `x-kubernetes-list-type: map` keys must be unique.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO.parent / "shared" / "crds"
CRD_FILES = {
    "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
}


@functools.lru_cache(maxsize=None)
def crd_schema(kind: str) -> dict:
    crd = yaml.safe_load((CRDS / CRD_FILES[kind]).read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    return version["schema"]["openAPIV3Schema"]


def _strict(schema: dict) -> dict:
    """The CRD schema as a JSON Schema that rejects unknown fields."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")
           and k not in ("properties", "items", "additionalProperties")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = _strict(schema["items"])
    if schema.get("nullable"):
        out.pop("nullable")
    return out


@functools.lru_cache(maxsize=None)
def _validator(kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(_strict(crd_schema(kind)["properties"]["spec"]))


@functools.lru_cache(maxsize=None)
def _program(rule: str):
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_errors(schema: dict, value: Any, path: str) -> list[str]:
    errors = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" in rule["rule"]:
            continue
        program = _program(rule["rule"])
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and result):
            errors.append(f"{path}: {rule.get('message', rule['rule'])}")
    if schema.get("x-kubernetes-list-type") == "map" and isinstance(value, list):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen = [tuple(item.get(k) for k in keys) for item in value]
        if len(seen) != len(set(seen)):
            errors.append(f"{path}: duplicate {keys} in a map-type list")
    if isinstance(value, dict):
        for key, sub in value.items():
            child = (schema.get("properties") or {}).get(key)
            if child is None and isinstance(schema.get("additionalProperties"), dict):
                child = schema["additionalProperties"]
            if child is not None:
                errors += _cel_errors(child, sub, f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += _cel_errors(schema["items"], item, f"{path}[{i}]")
    return errors


def validate(doc: dict) -> list[str]:
    """Every schema and CEL error in ``doc`` (empty: the API server would accept it)."""
    schema = crd_schema(doc["kind"])
    errors = []
    for key in doc:
        if key not in ("apiVersion", "kind", "metadata", "spec"):
            errors.append(f"{key}: unknown field")
    validator = _validator(doc["kind"])
    errors += [f"spec.{'.'.join(map(str, e.absolute_path))}: {e.message}"
               for e in validator.iter_errors(doc.get("spec"))]
    # CEL rules at the root see the whole object (TrainJob's name rules live there).
    errors += _cel_errors({k: v for k, v in schema.items() if k != "properties"}, doc, "")
    errors += _cel_errors(schema["properties"]["spec"], doc.get("spec"), "spec")
    return errors
