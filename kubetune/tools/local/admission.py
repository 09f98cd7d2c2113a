"""Evaluate the admission rules of `admission_rules.py` for a TrainJob and its runtime.

The rules are data; this module computes the facts they speak of from the TrainJob and the
runtime, takes the controller's own `tune run` choices (model, config, LoRA/QLoRA) from its
caller, `runtime_merge`, and prints each rejection as apimachinery's `field.Error` does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from kubetune.tools.local.admission_rules import (INITIALIZER_VOLUME, RULES,
                                                 TORCHRUN_RESERVED_ENV, TUNE_ENTRYPOINT)

_CONFIG_NAMES = {"dataset": "datasetConfig", "model": "modelConfig"}
_STEPS = {"dataset": "dataset-initializer", "model": "model-initializer"}
# What the caller tells of the controller's `tune run` choices (torchtune.go).
CONTROLLER_FACTS = ("tune_model", "tune_config", "uses_lora", "uses_qlora")


# -- facts, item by item, in the order upstream's plugins visit them -----------------------

def _dig(obj: Any, *keys: str) -> Any:
    for key in keys:
        obj = (obj or {}).get(key)
    return obj


def _jobs(runtime: dict) -> dict[str, dict]:
    return {j["name"]: j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}


def _pod(rjob: dict) -> dict:
    return _dig(rjob, "template", "spec", "template", "spec") or {}


def _names(pod: dict, *kinds: str) -> set[str]:
    return {c.get("name") for kind in kinds for c in pod.get(kind) or []}


def _runtime_ref(ref: dict) -> dict:
    """runtimeRef as the webhook sees it: the CRD's defaults filled in, Go's field order."""
    return {"name": ref.get("name"), "apiGroup": ref.get("apiGroup") or "trainer.kubeflow.org",
            "kind": ref.get("kind") or "ClusterTrainingRuntime"}


def _initializer_items(runtime: dict, trainjob: dict) -> Iterator[dict]:
    spec = trainjob["spec"]
    jobs = _jobs(runtime)
    for kind, step in _STEPS.items():
        if not _dig(spec, "initializer", kind):
            continue
        pod = _pod(jobs[step]) if step in jobs else {}
        container = next((c for c in pod.get("containers") or [] if c.get("name") == step),
                         None)
        yield {"step": step, "config_name": _CONFIG_NAMES[kind], "has_job": step in jobs,
               "has_container": step in _names(pod, "initContainers", "containers"),
               "mounts_initializer_volume": any(
                   m.get("name") == INITIALIZER_VOLUME
                   for m in (container or {}).get("volumeMounts") or []),
               "runtime_ref": _runtime_ref(spec["runtimeRef"])}


def _patch_items(runtime: dict, trainjob: dict) -> Iterator[tuple[str, dict]]:
    patches = trainjob["spec"].get("runtimePatches") or []
    jobs = _jobs(runtime)
    for patch in patches:
        manager = str(patch.get("manager") or "")
        domain, sep, path = manager.partition("/")
        yield "runtime_patch", {"manager": manager, "manager_split": bool(sep and domain and path),
                                "manager_domain": domain, "manager_path": path}
        for rpatch in _dig(patch, "trainingRuntimeSpec", "template", "spec",
                           "replicatedJobs") or []:
            name = rpatch.get("name")
            yield "patch_replicated_job", {"job": name, "job_exists": name in jobs,
                                           "runtime_patches": patches}
            if name not in jobs:
                continue
            present = _names(_pod(jobs[name]), "initContainers", "containers")
            for kind in ("initContainers", "containers"):
                for cpatch in _pod(rpatch).get(kind) or []:
                    yield "patch_container", {
                        "job": name, "kind": kind, "container": cpatch.get("name"),
                        "container_exists": cpatch.get("name") in present,
                        "sets_env": bool(cpatch.get("env")), "runtime_patches": patches}


def _env_target_items(runtime: dict) -> Iterator[dict]:
    torch = _dig(runtime, "spec", "mlPolicy", "torch")
    jobs = _jobs(runtime)
    for target in _dig(torch, "envInjection", "targets") or []:
        job = target.get("jobName")
        for container in target.get("containerNames") or []:
            present = _names(_pod(jobs[job]), "initContainers", "containers") \
                if job in jobs else set()
            yield {"torch_policy": torch is not None, "target": target,
                   "job_quoted": _go_quote(job), "container_quoted": _go_quote(container),
                   "container_exists": container in present}


def _quantities_as_strings(resources: dict | None) -> dict | None:
    """resourcesPerNode as the API server holds it: a quantity is a string (`gpu: 4` is
    "4"); not canonicalised further (upstream would print 2.5 as "2500m")."""
    if resources is None:
        return None
    return {section: ({k: str(v) for k, v in values.items()}
                      if isinstance(values, dict) else values)
            for section, values in resources.items()}


def _trainjob_facts(runtime: dict, trainjob: dict, controller: dict) -> dict:
    spec = trainjob["spec"]
    ref = spec["runtimeRef"]
    trainer = spec.get("trainer") or {}
    name = ref["name"]
    ref_kind = ref.get("kind") or "ClusterTrainingRuntime"
    nproc = trainer.get("numProcPerNode")
    reserved = sorted({e.get("name") for e in trainer.get("env") or []}
                      & set(TORCHRUN_RESERVED_ENV))
    return {
        **{key: controller[key] for key in CONTROLLER_FACTS},
        "runtime_name": name, "runtime_file_name": runtime["metadata"]["name"],
        "runtime_name_matches": name == runtime["metadata"]["name"],
        "runtime_ref_kind": ref_kind, "runtime_file_kind": runtime["kind"],
        "runtime_kind_matches": ref_kind == runtime["kind"], "runtime_ref": _runtime_ref(ref),
        "torch_policy": _dig(runtime, "spec", "mlPolicy", "torch") is not None,
        # Set means present, `trainer: {}` included (Go's non-nil pointer).
        "trainer_set": spec.get("trainer") is not None,
        "tune_run": trainer.get("command") == list(TUNE_ENTRYPOINT),
        "num_nodes": trainer.get("numNodes") or 1,
        "num_proc_per_node": "auto" if nproc is None else nproc,
        "resources_per_node": _quantities_as_strings(trainer.get("resourcesPerNode")),
        "trainer_env": trainer.get("env"), "reserved_env": reserved,
        # Go's %v of a []string.
        "reserved_env_list": "[" + " ".join(reserved) + "]",
    }


def _items(runtime: dict, trainjob: dict, controller: dict) -> Iterator[tuple[str, dict]]:
    """(scope, facts) for everything a rule may reject, in upstream's visiting order:
    the JobSet plugin (initializers, then each patch), then the Torch plugin (envInjection
    targets, the TrainJob, then each trainer arg)."""
    job_facts = _trainjob_facts(runtime, trainjob, controller)
    for facts in _initializer_items(runtime, trainjob):
        yield "initializer", facts
    yield from _patch_items(runtime, trainjob)
    for facts in _env_target_items(runtime):
        yield "env_injection_target", facts
    yield "trainjob", job_facts
    for index, arg in enumerate((trainjob["spec"].get("trainer") or {}).get("args") or []):
        key = arg.split("=", 1)[0]
        yield "trainer_arg", {**job_facts, "index": index, "arg": arg, "key": key,
                              "key_quoted": _go_quote(key)}


# -- the condition language ------------------------------------------------------------

_OPS = {
    "eq": lambda v, x: v == x, "ne": lambda v, x: v != x,
    "in": lambda v, x: v in x, "not_in": lambda v, x: v not in x,
    "gt": lambda v, x: v > x, "longer_than": lambda v, x: len(v) > x,
    "contains": lambda v, x: x in v, "not_contains": lambda v, x: x not in v,
    "matches": lambda v, x: re.fullmatch(x, v) is not None,
    "not_matches": lambda v, x: re.fullmatch(x, v) is None,
    "truthy": lambda v, x: bool(v) == x,
}


def holds(condition: dict, facts: dict) -> bool:
    """Whether a rule's `when` holds for these facts."""
    if "all" in condition:
        return all(holds(c, facts) for c in condition["all"])
    if "any" in condition:
        return any(holds(c, facts) for c in condition["any"])
    if "not" in condition:
        return not holds(condition["not"], facts)
    (op, operand), = ((k, v) for k, v in condition.items() if k != "fact")
    return _OPS[op](facts[condition["fact"]], operand)


# -- apimachinery's rendering of a field error -----------------------------------------

def _go_quote(text: Any) -> str:
    """Go's %q of a string (printable text, as our values are)."""
    return json.dumps(str(text), ensure_ascii=False)


def go_value(value: Any) -> str:
    """A bad value as field.Error prints it: %v for numbers and bools, %q for strings,
    encoding/json for the rest (whose HTML-safe escapes we repeat). Structured values are
    the TrainJob's as given, keys in its order; of the API server's defaults only
    runtimeRef's are added (not a patch's `time`, which the mutating webhook stamps)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return _go_quote(value)
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def field_error(rule: dict, facts: dict) -> str:
    """`<field>: Invalid value: <value>: <detail>`, or `<field>: Required value`."""
    if "message" in rule:
        return rule["message"].format(**facts)
    path = rule["field"].format(**facts)
    if rule["value"] is None:
        body = "Required value"
    else:
        body = f"Invalid value: {go_value(facts[rule['value']])}"
    detail = rule["detail"].format(**facts)
    return f"{path}: {body}: {detail}" if detail else f"{path}: {body}"


def rejections(runtime: dict, trainjob: dict, controller: dict) -> list[tuple[dict, str]]:
    """(rule, message) for every rule the TrainJob breaks, in the webhook's order.

    ``controller``: the controller's `tune run` choices for this TrainJob, a value for
    each name in CONTROLLER_FACTS.
    """
    found = []
    for scope, facts in _items(runtime, trainjob, controller):
        for rule in RULES:
            if rule["scope"] == scope and holds(rule["when"], facts):
                found.append((rule, field_error(rule, facts)))
    return found


def admission_errors(runtime: dict, trainjob: dict, controller: dict) -> list[str]:
    """Every admission error, each message once (as the webhook's aggregate lists them)."""
    return list(dict.fromkeys(message for _, message
                              in rejections(runtime, trainjob, controller)))
