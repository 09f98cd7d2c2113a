"""Merge a TrainJob into its runtime the way the Kubeflow Trainer controller does.

The result is the JobSet spec the controller would create. Followed, rule by rule, from
kubeflow/trainer's `pkg/runtime/core/trainingruntime.go` (pod counts, resourcesPerNode),
`plugins/torch` (PET_* env, into the node container and the containers
`mlPolicy.torch.envInjection` names; the `tune run` composition), `plugins/jobset` (initializer
and trainer overrides, runtimePatches) and `plugins/coscheduling` (the pod-group label).
Only the ClusterTrainingRuntime / TrainJob fields that change what a container runs are
modelled; the rest is carried through unchanged. The plugins' admission checks are the
rules of `admission_rules.py`; all their errors are raised at once (a ContractError, one
line each), as `kubectl apply` shows them.
"""

from __future__ import annotations

import copy
import logging

from kubetune import env as envnames
from kubetune.tools.local import admission_rules, node_resources
from kubetune.tools.local.admission import admission_errors
from kubetune.tools.local.violations import ContractError
from kubetune.trainer.request import methods

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"
ANCESTOR_TRAINER = "trainer"
NODE = "node"
TRAINER_PORT = 29500
COMPLETION_INDEX_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"

TUNE_ENTRYPOINT = list(admission_rules.TUNE_ENTRYPOINT)
# The only entries of the runtime's `tune run` command the controller carries over.
TUNE_IMMUTABLE = admission_rules.TUNE_IMMUTABLE_CONFIGS
log = logging.getLogger("kubetune.local")


# -- small helpers over plain dicts ------------------------------------------------------

def _pod_spec(rjob: dict) -> dict:
    return rjob["template"]["spec"]["template"]["spec"]


def _ancestor(rjob: dict) -> str | None:
    return ((rjob.get("template") or {}).get("metadata") or {}).get("labels", {}) \
        .get(ANCESTOR_LABEL)


def _container(rjob: dict, name: str) -> dict | None:
    return next((c for c in _pod_spec(rjob).get("containers", []) if c.get("name") == name),
                None)


def upsert_env(env: list[dict], *new: dict) -> None:
    """Replace a variable of the same name in place, else append (the controller's rule)."""
    for var in new:
        for i, old in enumerate(env):
            if old.get("name") == var["name"]:
                env[i] = copy.deepcopy(var)
                break
        else:
            env.append(copy.deepcopy(var))


# -- torchtune (plugins/torch/torchtune.go) ---------------------------------------------

def tune_model(runtime_name: str) -> str:
    """`torchtune-llama3.2-1b` -> `llama3_2/1B`; '' where the name has another shape."""
    fields = runtime_name.split("-")
    if len(fields) != 3:
        return ""
    return f"{fields[1].replace('.', '_')}/{fields[2].upper()}"


def _bool_arg(args: list[str], key: str) -> bool:
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and key in name and value.strip().lower() == "true":
            return True
    return False


def _uses_lora(args: list[str]) -> bool:
    return any("model.lora_attn_modules" in a for a in args)


def _uses_qlora(args: list[str]) -> bool:
    return not _bool_arg(args, "model.use_dora") and _bool_arg(args, "model.quantize_base")


def _dora_drops_qlora(args: list[str]) -> bool:
    """DoRA and quantize_base together: the controller picks a non-QLoRA config."""
    return _bool_arg(args, "model.use_dora") and _bool_arg(args, "model.quantize_base")


def tune_recipe_and_config(num_nodes: int, nproc: int | str, gpus: int, args: list[str],
                           runtime_name: str) -> tuple[str, str]:
    """The recipe and config the controller picks (getRecipeAndConfig): the method its
    args ask for, as the controller reads them, put to the trainer's one table."""
    method = "qlora" if _uses_qlora(args) else "lora" if _uses_lora(args) else "full"
    recipe, suffix = methods.controller_choice(method, num_nodes, nproc == 1 or gpus == 1)
    return recipe, tune_model(runtime_name) + suffix


def _admission_facts(runtime: dict, trainjob: dict) -> dict:
    """What validateTorchTune asks of the controller's `tune run` choices: admission sees
    numProcPerNode as given ("auto" when unset) and the GPUs of resourcesPerNode, else of
    the runtime's node container."""
    trainer = trainjob["spec"].get("trainer") or {}
    name = trainjob["spec"]["runtimeRef"]["name"]
    args = list(trainer.get("args") or [])
    _, config = tune_recipe_and_config(
        trainer.get("numNodes") or 1, trainer.get("numProcPerNode") or "auto",
        node_resources.gpus(_counted_resources(trainer, _trainer_node(runtime))), args, name)
    return {"tune_model": tune_model(name), "tune_config": config,
            "uses_lora": _uses_lora(args), "uses_qlora": _uses_qlora(args)}


def _counted_resources(trainer: dict | None, node: dict | None) -> dict | None:
    """The resources the torch plugin counts GPUs and CPUs in: the TrainJob's
    resourcesPerNode wherever it is set, even empty (then it counts none), else the
    runtime node container's -- not the two merged."""
    if trainer is not None and trainer.get("resourcesPerNode") is not None:
        return trainer["resourcesPerNode"]
    return (node or {}).get("resources")


def _trainer_node(runtime: dict) -> dict | None:
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        if _ancestor(rjob) == ANCESTOR_TRAINER and (node := _container(rjob, NODE)):
            return node
    return None


def _runtime_tune_overrides(spec: dict) -> list[str]:
    for rjob in spec["replicatedJobs"]:
        if _ancestor(rjob) == ANCESTOR_TRAINER and (node := _container(rjob, NODE)):
            return [c for c in node.get("command") or []
                    if c.split("=", 1)[0] in TUNE_IMMUTABLE]
    return []


# -- runtimePatches (core/trainingruntime.go mergeRuntimePatches) -----------------------

def _upsert_by(items: list[dict], new: list[dict], key: str, merge_fn=None) -> None:
    for item in new:
        old = next((o for o in items if o.get(key) == item.get(key)), None)
        if old is None:
            items.append(copy.deepcopy(item))
        elif merge_fn:
            merge_fn(old, item)
        else:
            old.clear()
            old.update(copy.deepcopy(item))


def _merge_container(old: dict, patch: dict) -> None:
    for key, value in patch.items():
        if key == "env":
            upsert_env(old.setdefault("env", []), *value)
        elif key == "volumeMounts":
            _upsert_by(old.setdefault("volumeMounts", []), value, "mountPath")
        elif key == "securityContext":
            old.setdefault("securityContext", {}).update(copy.deepcopy(value))
        elif key != "name":
            old[key] = copy.deepcopy(value)


def apply_runtime_patches(spec: dict, trainjob: dict) -> None:
    """Strategic-merge the TrainJob's runtimePatches into the JobSet template ``spec``.

    Admission (`admission.py`) has rejected patches of jobs or containers the runtime
    lacks, so every name here is found.
    """
    jobs = {j["name"]: j for j in spec["replicatedJobs"]}
    for patch in trainjob["spec"].get("runtimePatches") or []:
        tpl = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
        for rpatch in tpl.get("replicatedJobs") or []:
            job = jobs[rpatch["name"]]
            pod_patch = ((((rpatch.get("template") or {}).get("spec") or {})
                          .get("template") or {}).get("spec")) or {}
            pod = _pod_spec(job)
            for kind in ("initContainers", "containers"):
                for cpatch in pod_patch.get(kind) or []:
                    _merge_container(next(c for c in pod[kind] if c["name"] == cpatch["name"]),
                                     cpatch)
            for key, value in pod_patch.items():
                if key in ("containers", "initContainers"):
                    continue
                if key == "volumes":
                    _upsert_by(pod.setdefault("volumes", []), value, "name")
                elif isinstance(value, dict) and isinstance(pod.get(key), dict):
                    pod[key].update(copy.deepcopy(value))
                else:
                    pod[key] = copy.deepcopy(value)


# -- the merge ------------------------------------------------------------------------

def _pod_counts(jobs: list[dict], ml_policy: dict | None, trainer: dict | None
                ) -> dict[str, int]:
    """Pods per replicatedJob (newRuntimeInfo); resourcesPerNode merged into `node`."""
    counts: dict[str, int] = {}
    per_node = (trainer or {}).get("resourcesPerNode")
    for rjob in jobs:
        count = rjob["template"]["spec"].get("parallelism", 1)
        if _ancestor(rjob) == ANCESTOR_TRAINER and ml_policy is not None:
            count = ml_policy.get("numNodes") or 1
            if per_node is not None and (node := _container(rjob, NODE)):
                node["resources"] = node_resources.merge(node.get("resources"), per_node)
        counts[rjob["name"]] = count
    return counts


def _enforce_torch(runtime: dict, trainjob: dict, trainer_job: dict | None,
                   counts: dict[str, int]) -> None:
    """The torch plugin's EnforceMLPolicy: node count, PET_* env, the `tune run` command.

    A TrainJob with ``spec.trainer`` -- any, ``trainer: {}`` included (absent and empty
    differ: Go sees a non-nil pointer) -- gets PET_* and the port on its node container;
    without it the node container is left alone. The containers the runtime's
    ``envInjection`` names get PET_* and the master address either way.
    """
    name = trainjob["metadata"]["name"]
    trainer = trainjob["spec"].get("trainer")
    node = _container(trainer_job, NODE) if trainer_job is not None else None
    if trainer_job is not None and trainer is not None and trainer.get("numNodes"):
        counts[trainer_job["name"]] = trainer["numNodes"]
    num_nodes = counts[trainer_job["name"]] if trainer_job is not None else 1
    nproc: int | str = (trainer or {}).get("numProcPerNode") or "auto"
    resources = _counted_resources(trainer, node)
    gpus = node_resources.gpus(resources)
    if nproc == "auto" and gpus == 0:
        nproc = max(1, node_resources.cpus(resources))
    pet = [{"name": envnames.PET_NNODES, "value": str(num_nodes)},
           {"name": envnames.PET_NPROC_PER_NODE, "value": str(nproc)},
           {"name": envnames.PET_NODE_RANK, "valueFrom": {"fieldRef": {
               "fieldPath": COMPLETION_INDEX_PATH}}}]
    master = f"{name}-{NODE}-0-0.{name}"
    master_env = [{"name": envnames.PET_MASTER_ADDR, "value": master},
                  {"name": envnames.PET_MASTER_PORT, "value": str(TRAINER_PORT)}]
    if node is not None and trainer is not None:
        _enforce_on_node(runtime, trainjob, node, pet, master_env,
                         (num_nodes, nproc, gpus, master))
    _inject_into_targets(runtime, pet + master_env)


def _enforce_on_node(runtime: dict, trainjob: dict, node: dict, pet: list[dict],
                     master_env: list[dict], topology: tuple) -> None:
    """PET_* and the port into the node container; master address for torchrun, or the
    `tune run` command completed (rendezvous, recipe, config, the runtime's paths)."""
    trainer = trainjob["spec"]["trainer"]
    num_nodes, nproc, gpus, master = topology
    env = node.setdefault("env", [])
    upsert_env(env, *(trainer.get("env") or []))
    upsert_env(env, *pet)
    if trainer.get("command") != TUNE_ENTRYPOINT:
        upsert_env(env, *master_env)
    else:
        args = list(trainer.get("args") or [])
        if _dora_drops_qlora(args):
            # The controller does this silently; say so here.
            log.warning("trainer.args set model.use_dora=True and model.quantize_base=True: "
                        "the controller picks a DoRA config without QLoRA (the base model is "
                        "not quantized)")
        command: list[str] = []
        if num_nodes > 1 or (isinstance(nproc, int) and nproc > 1) or \
                (nproc == "auto" and gpus > 1):
            command.append(f"--rdzv_endpoint={master}:{TRAINER_PORT}")
        recipe, config = tune_recipe_and_config(num_nodes, nproc, gpus, args,
                                                trainjob["spec"]["runtimeRef"]["name"])
        spec = runtime["spec"]["template"]["spec"]
        command += [recipe, "--config", config, *_runtime_tune_overrides(spec)]
        trainer["command"] = [*trainer["command"], *command]
    ports = node.setdefault("ports", [])
    if not any(p.get("containerPort") == TRAINER_PORT for p in ports):
        ports.append({"containerPort": TRAINER_PORT})


def _inject_into_targets(runtime: dict, env: list[dict]) -> None:
    """PET_* and the master address into every container ``mlPolicy.torch.envInjection``
    names (v2.3, #3516): a container of that job first, else an init container of that
    name. Admission has refused a target the runtime lacks."""
    targets = ((runtime["spec"].get("mlPolicy") or {}).get("torch") or {}).get(
        "envInjection") or {}
    jobs = {j["name"]: j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    for target in targets.get("targets") or []:
        pod = _pod_spec(jobs[target["jobName"]])
        for name in target.get("containerNames") or []:
            container = next(c for kind in ("containers", "initContainers")
                             for c in pod.get(kind) or [] if c.get("name") == name)
            upsert_env(container.setdefault("env", []), *env)


def _apply_initializers(jobs: list[dict], initializer: dict) -> None:
    """Builder.Initializer: STORAGE_URI, env and secretRef into the initializer containers."""
    for rjob in jobs:
        for step, kind in ((DATASET_INITIALIZER, "dataset"), (MODEL_INITIALIZER, "model")):
            if _ancestor(rjob) != step:
                continue
            rjob["replicas"] = 1
            override = initializer.get(kind)
            container = _container(rjob, step)
            if not override or container is None:
                continue
            env = container.setdefault("env", [])
            if override.get("storageUri"):
                upsert_env(env, {"name": envnames.STORAGE_URI, "value": override["storageUri"]})
            upsert_env(env, *(override.get("env") or []))
            if override.get("secretRef"):
                container.setdefault("envFrom", []).append(
                    {"secretRef": {"name": override["secretRef"]["name"]}})


def _apply_trainer(trainer_job: dict, trainer: dict | None) -> None:
    """Builder.Trainer: image, command and args replace the runtime's; env upserts."""
    trainer_job["replicas"] = 1
    node = _container(trainer_job, NODE)
    if node is None or trainer is None:
        return
    for key in ("image", "command", "args"):
        if trainer.get(key) is not None:
            node[key] = copy.deepcopy(trainer[key])
    upsert_env(node.setdefault("env", []), *(trainer.get("env") or []))


def merge(runtime: dict, trainjob: dict) -> dict:
    """The JobSet (``apiVersion``, ``kind``, ``metadata``, ``spec``) the controller creates."""
    runtime, trainjob = copy.deepcopy(runtime), copy.deepcopy(trainjob)
    errors = admission_errors(runtime, trainjob, _admission_facts(runtime, trainjob))
    if errors:
        # All of them, runtimePatches' included, as the webhook aggregates every
        # plugin's field errors.
        raise ContractError([f"TrainJob rejected: {error}" for error in errors], sort=False,
                            message="TrainJob rejected: " + "; ".join(errors))
    name = trainjob["metadata"]["name"]
    trainer = trainjob["spec"].get("trainer")
    ml_policy = runtime["spec"].get("mlPolicy")
    spec = runtime["spec"]["template"]["spec"]
    jobs = spec["replicatedJobs"]
    apply_runtime_patches(spec, trainjob)
    counts = _pod_counts(jobs, ml_policy, trainer)
    trainer_job = next((j for j in jobs if _ancestor(j) == ANCESTOR_TRAINER), None)
    if (ml_policy or {}).get("torch") is not None:
        _enforce_torch(runtime, trainjob, trainer_job, counts)
    # PodSet counts -> parallelism/completions (syncParallelCount).
    for rjob in jobs:
        rjob["template"]["spec"]["parallelism"] = counts[rjob["name"]]
        rjob["template"]["spec"]["completions"] = counts[rjob["name"]]
    _apply_initializers(jobs, trainjob["spec"].get("initializer") or {})
    if trainer_job is not None:
        _apply_trainer(trainer_job, trainer)
    # Gang scheduling: every pod of the JobSet joins the TrainJob's pod group.
    if ((runtime["spec"].get("podGroupPolicy") or {}).get("coscheduling")) is not None:
        for rjob in jobs:
            pod_meta = rjob["template"]["spec"]["template"].setdefault("metadata", {})
            pod_meta.setdefault("labels", {})[POD_GROUP_LABEL] = name
    labels = dict((runtime["spec"]["template"].get("metadata") or {}).get("labels") or {})
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "labels": labels}, "spec": spec}
