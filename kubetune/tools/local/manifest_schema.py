"""A TrainJob or runtime checked against its CRD's schema as `kubectl apply` checks it
(strict field validation, kubectl's default): an unknown field or a value of the wrong
type is refused, every one at once (one line each, sorted by path), naming the file, the
path and the field it likely meant.

Without this, a misspelt field (`storageURI:`) is pruned by the merge as the API server
would prune it, and the run goes on with the runtime's default in its place. The schemas
are shipped cut down in ``crd_schemas.json`` (written by ``crd_schema_gen.py``)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Iterator

from kubetune.suggest import closest
from kubetune.tools.local.crd_schema_gen import SCHEMA_FILE
from kubetune.tools.local.violations import raise_all

# ObjectMeta as the API server reads it: the CRDs leave `metadata` an open object.
OBJECT_META = {"name", "namespace", "generateName", "labels", "annotations", "uid",
               "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
               "deletionGracePeriodSeconds", "ownerReferences", "finalizers",
               "managedFields", "selfLink"}

_TYPES = {"object": (dict, "an object"), "array": (list, "a list"), "string": (str, "a string"),
          "integer": (int, "an integer"),
          "number": ((int, float), "a number"),
          "boolean": (bool, "true or false")}


@functools.lru_cache(maxsize=None)
def _schemas() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())


def _described(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    return "an object" if isinstance(value, dict) else "a list"


def _integer(value: Any) -> bool:
    """JSON's integers, 1.0 included (the SDK writes a GPU count as a float; the API
    server reads an integral number as an integer)."""
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer())


def _type_problem(value: Any, schema: dict, path: str) -> str | None:
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, str) or _integer(value)
        return None if ok else f"{path}: expected an integer or a string, got {_described(value)}"
    wanted = schema.get("type")
    if wanted not in _TYPES:
        return None
    kinds, words = _TYPES[wanted]
    ok = _integer(value) if wanted == "integer" else isinstance(value, kinds) and (
        wanted == "boolean" or not isinstance(value, bool))
    if ok:
        return None
    hint = f" (quote it: \"{value}\")" if wanted == "string" and not isinstance(
        value, (dict, list)) else ""
    return f"{path}: expected {words}, got {_described(value)}{hint}"


def _nearest(name: str, known: set[str]) -> str:
    """The field meant: the same name in other case (`storageURI`), else a near one; with
    none, the fields there are, when they are few."""
    same = [k for k in known if k.lower() == name.lower()]
    guess = same[0] if same else closest(name, known)
    if guess:
        return f" (did you mean {guess}?)"
    return f" (known here: {', '.join(sorted(known))})" if len(known) <= 8 else ""


def _object_problems(value: dict, schema: dict, path: str) -> Iterator[str]:
    props = schema.get("properties")
    for key in schema.get("required") or []:
        if key not in value:
            yield f"{path}.{key}: required field missing"
    extra = schema.get("additionalProperties")
    for key, sub in value.items():
        where = f"{path}.{key}" if path else str(key)
        if props is not None and key in props:
            yield from _problems(sub, props[key], where)
        elif isinstance(extra, dict):
            yield from _problems(sub, extra, where)
        elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
            yield f"{where}: unknown field{_nearest(str(key), set(props))}"


def _problems(value: Any, schema: dict, path: str) -> Iterator[str]:
    if value is None:
        return  # the API server prunes a null before validating
    problem = _type_problem(value, schema, path)
    if problem:
        yield problem
        return
    if "enum" in schema and value not in schema["enum"]:
        yield f"{path}: {value!r} is not one of {', '.join(map(str, schema['enum']))}"
    if isinstance(value, dict):
        yield from _object_problems(value, schema, path)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _problems(item, schema["items"], f"{path}[{i}]")


def problems(doc: dict[str, Any]) -> list[str]:
    """Every field of ``doc`` that `kubectl apply` would refuse, as ``path: why``."""
    entry = _schemas()[doc["kind"]]
    found = list(_problems(doc, entry["schema"], ""))
    for key in doc.get("metadata") or {}:
        if key not in OBJECT_META:
            found.append(f"metadata.{key}: unknown field{_nearest(str(key), OBJECT_META)}")
    return found


def check(doc: dict[str, Any], path: Path) -> None:
    """Refuse ``doc`` (read from ``path``) where `kubectl apply` would: a ContractError
    with every problem, one line each."""
    raise_all([f"{path}: {found}; kubectl apply refuses this {doc['kind']} too"
               for found in problems(doc)])
