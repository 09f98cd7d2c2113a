"""Kubeflow Trainer v2.3.0's own unit tests of what `kubetune local` emulates, replayed on
our emulator (kubetune.tools.local: runtime_merge, node_resources, admission).

Each case is one of upstream's, under upstream's name (file: test: case), restated in our
words: the runtime and TrainJob it builds, as manifests, and what it expects of the
JobSet the controller creates (pods per job, PET_* env and the trainer port per
container, node resources, the `tune run` choice) or the admission error it answers with.
The files (kubeflow/trainer at tag v2.3.0):

- pkg/runtime/framework/plugins/torch/torch_test.go: TestTorchEnforceMLPolicy,
  TestTorchValidate (PET_*, numProcPerNode, envInjection (#3516), reserved env, torchtune
  admission);
- pkg/runtime/framework/plugins/torch/torchtune_test.go: the `tune run` recipe/config
  choice and the runtime paths carried over;
- pkg/util/trainingruntime/trainingruntime_test.go: TestMergeResourceRequirements and
  pkg/runtime/core/trainingruntime_test.go's merged-resourcesPerNode case (#3602).

Cases upstream writes against a nil runtime info have no manifest form; NOT_APPLICABLE
lists them. The count is asserted, so a case cannot drop out unnoticed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kubetune.errors import BadInputError
from kubetune.tools.local.runtime_merge import (COMPLETION_INDEX_PATH, merge, tune_model,
                                                tune_recipe_and_config)

TORCH = "pkg/runtime/framework/plugins/torch/torch_test.go"
TUNE = "pkg/runtime/framework/plugins/torch/torchtune_test.go"
MERGE = "pkg/util/trainingruntime/trainingruntime_test.go: TestMergeResourceRequirements"
CORE = "pkg/runtime/core/trainingruntime_test.go: TestTrainingRuntimeNewObjects"
ENFORCE = f"{TORCH}: TestTorchEnforceMLPolicy"
VALIDATE = f"{TORCH}: TestTorchValidate"

NOT_APPLICABLE = {
    f"{ENFORCE}: no action when info is nil": "a TrainJob always has a runtime here",
    f"{VALIDATE}: no action when info is nil": "a TrainJob always has a runtime here",
}
EXPECTED_CASES = 77  # every applicable case of the files above

RANK = {"fieldRef": {"fieldPath": COMPLETION_INDEX_PATH}}
PORT = 29500


# -- manifests as upstream's wrappers build them ------------------------------------------

def pod_job(name: str, ancestor: str | None = "trainer", containers=("node",), init=(),
            resources: dict | None = None, commands: dict | None = None) -> dict:
    def container(n: str) -> dict:
        c: dict = {"name": n}
        if n == "node" and resources is not None:
            c["resources"] = resources
        if n in (commands or {}):
            c["command"] = commands[n]
        return c

    pod: dict = {"containers": [container(n) for n in containers]}
    if init:
        pod["initContainers"] = [{"name": n} for n in init]
    template: dict = {"spec": {"template": {"spec": pod}}}
    if ancestor:
        template["metadata"] = {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step":
                                           ancestor}}
    return {"name": name, "template": template}


def runtime(name: str = "test-runtime", *, torch: dict | None = None, num_nodes: int = 1,
            jobs: list[dict] | None = None, ml_policy: bool = True,
            with_torch: bool = True) -> dict:
    spec: dict = {"template": {"spec": {"replicatedJobs": jobs or [pod_job("node")]}}}
    if ml_policy:
        spec["mlPolicy"] = {"numNodes": num_nodes}
        if with_torch:
            spec["mlPolicy"]["torch"] = torch or {}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name}, "spec": spec}


def trainjob(name: str = "test-job", trainer: dict | None = None,
             runtime_name: str = "test-runtime") -> dict:
    spec: dict = {"runtimeRef": {"name": runtime_name}}
    if trainer is not None:
        spec["trainer"] = trainer
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name}, "spec": spec}


def requests(**resources) -> dict:
    """MakeTrainJobTrainerWrapper().Container(...)'s resourcesPerNode: requests only."""
    return {"requests": {k.replace("_", "."): v for k, v in resources.items()}}


def injection(*targets: tuple[str, list[str]]) -> dict:
    return {"envInjection": {"targets": [{"jobName": j, "containerNames": list(c)}
                                         for j, c in targets]}}


def pet(nnodes: int, nproc: int | str, master: str | None = None) -> dict:
    env = {"PET_NNODES": str(nnodes), "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": RANK}
    if master:
        env |= {"PET_MASTER_ADDR": f"{master}-node-0-0.{master}", "PET_MASTER_PORT": str(PORT)}
    return env


# -- what a case expects, and what the emulator did ---------------------------------------

@dataclass
class Case:
    id: str
    runtime: dict
    trainjob: dict
    pods: dict = field(default_factory=dict)  # job -> parallelism
    # "job/container" -> its PET_* variables (None: none at all)
    pet: dict = field(default_factory=dict)
    ports: dict = field(default_factory=dict)  # "job/container" -> has the trainer port
    resources: dict | None = None  # the node container's, merged
    error: str | None = None  # the admission error, whole


def _containers(jobset: dict):
    for job in jobset["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]["spec"]
        for c in (pod.get("initContainers") or []) + pod["containers"]:
            yield job, f"{job['name']}/{c['name']}", c


def outcome(case: Case) -> dict:
    try:
        jobset = merge(case.runtime, case.trainjob)
    except BadInputError as exc:
        return {"error": str(exc)}
    got: dict = {"pods": {}, "pet": {}, "ports": {}}
    for job, key, c in _containers(jobset):
        got["pods"][job["name"]] = job["template"]["spec"]["parallelism"]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []
               if e["name"].startswith("PET_")}
        got["pet"][key] = env or None
        got["ports"][key] = any(p.get("containerPort") == PORT for p in c.get("ports") or [])
        if key == "node/node":
            got["resources"] = c.get("resources")
    return got


def expected(case: Case) -> dict:
    if case.error is not None:
        return {"error": case.error}
    want: dict = {"pods": case.pods, "pet": case.pet, "ports": case.ports}
    if case.resources is not None:
        want["resources"] = case.resources
    return want


def observed(case: Case) -> dict:
    """The emulator's outcome, cut to what the case states."""
    got = outcome(case)
    if "error" in got or case.error is not None:
        return got
    cut = {"pods": {j: got["pods"][j] for j in case.pods},
           "pet": {k: got["pet"].get(k) for k in case.pet},
           "ports": {k: got["ports"].get(k) for k in case.ports}}
    if case.resources is not None:
        cut["resources"] = got.get("resources")
    return cut


# -- torch_test.go: TestTorchEnforceMLPolicy ----------------------------------------------

def _nproc_case(name: str, job_name: str, nproc: int | str, **trainer) -> Case:
    """Upstream's numProcPerNode cases: one node, the TrainJob's resourcesPerNode."""
    return Case(f"{ENFORCE}: {name}", runtime(), trainjob(job_name, {"image": "test:image",
                                                                     **trainer}),
                pods={"node": 1}, pet={"node/node": pet(1, nproc, job_name)},
                ports={"node/node": True})


TUNE_ARGS = ["dtype=fp16", "batch_size=32", "epochs=10",
             "loss=torchtune.modules.loss.CEWithChunkedOutputLoss"]
IMAGE = "ghcr.io/kubeflow/trainer/torchtune-trainer"

ENFORCE_CASES = [
    Case(f"{ENFORCE}: no action when mlPolicySource is nil",
         runtime(ml_policy=False), trainjob(trainer={"numNodes": 2}),
         pods={"node": 1}, pet={"node/node": None}, ports={"node/node": False}),
    Case(f"{ENFORCE}: no action when mlPolicySource torch is null",
         runtime(with_torch=False), trainjob(trainer={"numNodes": 2}),
         pet={"node/node": None}, ports={"node/node": False}),
    Case(f"{ENFORCE}: trainJob numNodes is respected rather than mlPolicy one",
         runtime(), trainjob("trainJob", {"numNodes": 2}),
         pods={"node": 2}, pet={"node/node": pet(2, 1, "trainJob")}, ports={"node/node": True}),
    _nproc_case("nproc_per_node=auto with CPU limit", "test-job", 4,
                resourcesPerNode=requests(cpu="4")),
    # Container(image, nil, nil, nil): resourcesPerNode set, and empty.
    _nproc_case("nproc_per_node=auto with no CPU resources", "test-job", 1,
                resourcesPerNode={}),
    _nproc_case("nproc_per_node=auto with low CPU limit", "test-job", 2,
                resourcesPerNode=requests(cpu="2")),
    _nproc_case("nproc_per_node=auto with CPU request but no limit", "test-job", 3,
                resourcesPerNode=requests(cpu="3")),
    _nproc_case("nproc_per_node=auto with millicore CPU limit", "test-job", 3,
                resourcesPerNode=requests(cpu="2.5")),
    _nproc_case("nproc_per_node=auto with fractional CPU limit", "test-job", 1,
                resourcesPerNode=requests(cpu="0.7")),
    _nproc_case("nproc_per_node=auto with GPU request should remain auto", "test-job", "auto",
                resourcesPerNode={"requests": {"example.com/gpu": "2"}}),
    _nproc_case("explicitly set nproc_per_node should be preserved", "test-job", 3,
                numProcPerNode=3, resourcesPerNode=requests(cpu="8")),
    _nproc_case("nproc_per_node=auto with millicore CPU limit in m format", "test-job", 3,
                resourcesPerNode=requests(cpu="2500m")),
    _nproc_case("nproc_per_node=cpu with CPU limit", "cpu-job", 4,
                resourcesPerNode=requests(cpu="4")),
    _nproc_case("nproc_per_node=auto resolves to GPU count when GPU resources present",
                "cpu-gpu-job", "auto",
                resourcesPerNode={"requests": {"cpu": "6", "example.com/gpu": "2"}}),
    _nproc_case("nproc_per_node=cpu with fractional CPU", "cpu-frac-job", 4,
                resourcesPerNode=requests(cpu="3.7")),
    Case(f"{ENFORCE}: multi-node multi-GPU training with complete info",
         runtime(num_nodes=2),
         trainjob("gpu-job", {"numNodes": 4, "image": "pytorch/pytorch:2.0.0-cuda11.7",
                              "resourcesPerNode": {"requests": {
                                  "cpu": "8", "memory": "16Gi", "example.com/gpu": "4"}}}),
         pods={"node": 4}, pet={"node/node": pet(4, "auto", "gpu-job")},
         ports={"node/node": True}),
    # torchtune: PET_* without the master address (rendezvous is on the command line).
    Case(f"{ENFORCE}: multi-devices full fine-tuning with torchtune",
         runtime("torchtune-llama3.2-1b"),
         trainjob("torchtune-job", {"numNodes": 1, "image": IMAGE, "command": ["tune", "run"],
                                    "args": TUNE_ARGS, "resourcesPerNode": {"requests": {
                                        "cpu": "8", "memory": "16Gi",
                                        "example.com/gpu": "4"}}}, "torchtune-llama3.2-1b"),
         pods={"node": 1}, pet={"node/node": pet(1, "auto")}, ports={"node/node": True}),
    Case(f"{ENFORCE}: single-device full fine-tuning with torchtune",
         runtime("torchtune-llama3.2-1b"),
         trainjob("torchtune-job", {"numNodes": 1, "numProcPerNode": 1, "image": IMAGE,
                                    "command": ["tune", "run"], "args": TUNE_ARGS,
                                    "resourcesPerNode": {"requests": {
                                        "cpu": "8", "memory": "16Gi",
                                        "example.com/gpu": "1"}}}, "torchtune-llama3.2-1b"),
         pods={"node": 1}, pet={"node/node": pet(1, 1)}, ports={"node/node": True}),
    Case(f"{ENFORCE}: multi-nodes full fine-tuning with torchtune",
         runtime("torchtune-llama3.3-70b", num_nodes=2),
         trainjob("torchtune-job", {"numNodes": 2, "numProcPerNode": 8, "image": IMAGE,
                                    "command": ["tune", "run"], "args": TUNE_ARGS,
                                    "resourcesPerNode": {"requests": {
                                        "cpu": "8", "memory": "16Gi",
                                        "example.com/gpu": "8"}}}, "torchtune-llama3.3-70b"),
         pods={"node": 2}, pet={"node/node": pet(2, 8)}, ports={"node/node": True}),
    # envInjection (#3516): the named containers get PET_* and the master address.
    Case(f"{ENFORCE}: envInjection with init container",
         runtime(torch=injection(("node", ["preflight-check"])), num_nodes=2,
                 jobs=[pod_job("node", init=["preflight-check"])]),
         trainjob(trainer={"numNodes": 2}),
         pods={"node": 2}, pet={"node/preflight-check": pet(2, 1, "test-job"),
                                "node/node": pet(2, 1, "test-job")},
         ports={"node/preflight-check": False, "node/node": True}),
    Case(f"{ENFORCE}: envInjection target container does not exist",
         runtime(torch=injection(("node", ["non-existent-container"])),
                 jobs=[pod_job("node", init=["preflight-check"])]),
         trainjob(trainer={}),
         error='TrainJob rejected: spec.runtimeRef: Invalid value: {"jobName":"node",'
               '"containerNames":["non-existent-container"]}: envInjection target podSet '
               '"node" container "non-existent-container" not found in runtime template'),
    Case(f"{ENFORCE}: envInjection with torchtune command",
         # Upstream hands EnforceMLPolicy two nodes of the 1B model, which its webhook
         # refuses first (only llama3_3/70B trains on several nodes): the 70B runtime here,
         # the same env either way.
         runtime("torchtune-llama3.3-70b", torch=injection(("node", ["preflight-check"])),
                 num_nodes=2, jobs=[pod_job("node", init=["preflight-check"])]),
         trainjob(trainer={"numNodes": 2, "image": IMAGE, "command": ["tune", "run"],
                           "args": ["dtype=fp16"], "resourcesPerNode": {"requests": {
                               "cpu": "8", "example.com/gpu": "4"}}},
                  runtime_name="torchtune-llama3.3-70b"),
         pods={"node": 2}, pet={"node/preflight-check": pet(2, "auto", "test-job"),
                                "node/node": pet(2, "auto")},
         ports={"node/node": True}),
    Case(f"{ENFORCE}: envInjection with multiple containers in same target",
         runtime(torch=injection(("node", ["nccl-check", "driver-check"])), num_nodes=2,
                 jobs=[pod_job("node", init=["nccl-check", "driver-check"])]),
         trainjob(trainer={"numNodes": 2}),
         pods={"node": 2}, pet={"node/nccl-check": pet(2, 1, "test-job"),
                                "node/driver-check": pet(2, 1, "test-job"),
                                "node/node": pet(2, 1, "test-job")}),
    Case(f"{ENFORCE}: envInjection with sidecar (regular container)",
         runtime(torch=injection(("node", ["sidecar"])),
                 jobs=[pod_job("node", containers=("sidecar", "node"))]),
         trainjob(trainer={}),
         pods={"node": 1}, pet={"node/sidecar": pet(1, 1, "test-job"),
                                "node/node": pet(1, 1, "test-job")},
         ports={"node/sidecar": False, "node/node": True}),
    Case(f"{ENFORCE}: envInjection with empty targets (no additional injection)",
         runtime(torch={"envInjection": {"targets": []}},
                 jobs=[pod_job("node", init=["preflight-check"])]),
         trainjob(trainer={}),
         pet={"node/preflight-check": None, "node/node": pet(1, 1, "test-job")},
         ports={"node/node": True}),
    Case(f"{ENFORCE}: envInjection target job does not exist",
         runtime(torch=injection(("missing-job", ["preflight-check"]))),
         trainjob(trainer={}),
         error='TrainJob rejected: spec.runtimeRef: Invalid value: {"jobName":"missing-job",'
               '"containerNames":["preflight-check"]}: envInjection target podSet '
               '"missing-job" container "preflight-check" not found in runtime template'),
    Case(f"{ENFORCE}: envInjection with multiple targets in different jobs leaves unlisted "
         "init container unchanged",
         runtime(torch=injection(("node", ["sidecar"]), ("worker", ["worker-check"])),
                 num_nodes=2,
                 jobs=[pod_job("node", init=["preflight-check"], containers=("sidecar", "node")),
                       pod_job("worker", ancestor=None, init=["worker-check"],
                               containers=("worker",))]),
         trainjob(trainer={"numNodes": 2}),
         pods={"node": 2, "worker": 1},
         pet={"node/preflight-check": None, "node/sidecar": pet(2, 1, "test-job"),
              "node/node": pet(2, 1, "test-job"), "worker/worker-check": pet(2, 1, "test-job"),
              "worker/worker": None}),
]


# -- torch_test.go: TestTorchValidate -----------------------------------------------------

def _validate(name: str, rt: dict, tj: dict, error: str | None = None) -> Case:
    """Admitted (no error), or refused with exactly ``error``."""
    return Case(f"{VALIDATE}: {name}", rt, tj, error=error)


def _tune(runtime_name: str, args=None, num_nodes: int = 1, resources=None) -> dict:
    return trainjob("test", {"numNodes": num_nodes, "image": IMAGE, "command": ["tune", "run"],
                             "args": args, "resourcesPerNode": {"requests": resources or {}}},
                    runtime_name)


LORA_ARGS = ["model.lora_attn_modules=[q_proj, v_proj, output_proj]"]
IMMUTABLE = "must not set immutable config {key} in trainer args; it is managed by the runtime"

VALIDATE_CASES = [
    _validate("no action when info does not have MLPolicySource",
              runtime(ml_policy=False), trainjob("test")),
    _validate("no action when info has MLPolicySource but no Torch policy",
              runtime(with_torch=False), trainjob("test")),
    _validate("envInjection target container does not exist",
              runtime(torch=injection(("node", ["missing-container"]))), trainjob("test"),
              'TrainJob rejected: spec.runtimeRef: Invalid value: {"jobName":"node",'
              '"containerNames":["missing-container"]}: envInjection target podSet "node" '
              'container "missing-container" not found in runtime template'),
    _validate("no action when info does not have numProcPerNode",
              runtime(), trainjob("test", {})),
    _validate("valid environment variable present", runtime(), trainjob("test", {"env": [
        {"name": "test", "value": "value"}, {"name": "test2", "value": "value"}]})),
    _validate("reserved environment variable present", runtime(), trainjob("test", {"env": [
        {"name": "test", "value": "value"}, {"name": "PET_NPROC_PER_NODE", "value": "value"}]}),
              'TrainJob rejected: spec.trainer.env: Invalid value: [{"name":"test","value":'
              '"value"},{"name":"PET_NPROC_PER_NODE","value":"value"}]: must not have reserved '
              "envs, invalid envs configured: [PET_NPROC_PER_NODE]"),
    _validate("unsupported pretrained model", runtime("torchtune-llama3.1-70b"),
              _tune("torchtune-llama3.1-70b"),
              'TrainJob rejected: spec.runtimeRef.name: Invalid value: "torchtune-llama3.1-70b":'
              " must have a supported pretrained model, invalid model configured: "
              "llama3_1/70B"),
    _validate("multi-node mode is only enabled for Llama-3.3-70b",
              runtime("torchtune-llama3.2-3b"), _tune("torchtune-llama3.2-3b", num_nodes=2),
              "TrainJob rejected: spec.trainer.numNodes: Invalid value: 2: must be 1 for "
              "llama3_2/3B model"),
    _validate("qlora is not supported for qwen in torchtune", runtime("torchtune-qwen2.5-1.5b"),
              _tune("torchtune-qwen2.5-1.5b", [*LORA_ARGS, "model.quantize_base=True"]),
              'TrainJob rejected: spec.runtimeRef.name: Invalid value: "torchtune-qwen2.5-1.5b":'
              " QLoRA is not supported for qwen2_5/1.5B model"),
    _validate("muti-devices qlora is not supported for llama3.2-1b in torchtune",
              runtime("torchtune-llama3.2-1b"),
              _tune("torchtune-llama3.2-1b", [*LORA_ARGS, "model.quantize_base=True"],
                    resources={"example.com/gpu": "2"}),
              'TrainJob rejected: spec.trainer.numProcPerNode: Invalid value: "auto": must be '
              "auto or 1 for llama3_2/1B model when using QLoRA; "
              'spec.trainer.resourcesPerNode: Invalid value: {"requests":{"example.com/gpu":'
              '"2"}}: must have gpu resource with value 1 for llama3_2/1B model when using '
              "QLoRA"),
    _validate("lora is not supported for multi-node training in torchtune",
              runtime("torchtune-llama3.3-70b"),
              _tune("torchtune-llama3.3-70b", LORA_ARGS, num_nodes=2),
              "TrainJob rejected: spec.trainer.numNodes: Invalid value: 2: LoRA fine-tuning is "
              "not supported for multi-node training in TorchTune"),
    _validate("lora is supported for single-node training in torchtune",
              runtime("torchtune-llama3.3-70b"), _tune("torchtune-llama3.3-70b", LORA_ARGS)),
    _validate("immutable runtime config must not be set in trainer args",
              runtime("torchtune-llama3.2-1b"),
              _tune("torchtune-llama3.2-1b", ["output_dir=/custom/output"]),
              'TrainJob rejected: spec.trainer.args[0]: Invalid value: "output_dir=/custom/output"'
              ": " + IMMUTABLE.format(key='"output_dir"')),
    _validate("multiple immutable runtime configs must not be set in trainer args",
              runtime("torchtune-llama3.2-1b"),
              _tune("torchtune-llama3.2-1b", ["output_dir=custom-output",
                                              "tokenizer.path=/some/path"]),
              'TrainJob rejected: spec.trainer.args[0]: Invalid value: "output_dir=custom-output"'
              ": " + IMMUTABLE.format(key='"output_dir"') + "; "
              'spec.trainer.args[1]: Invalid value: "tokenizer.path=/some/path": '
              + IMMUTABLE.format(key='"tokenizer.path"')),
]


# -- trainingruntime_test.go: resourcesPerNode merged into the runtime's (#3602) -----------

def _merge_case(name: str, base: dict, override: dict, want: dict) -> Case:
    rt = runtime(with_torch=False, jobs=[pod_job("node", resources=base)])
    return Case(f"{MERGE}: {name}", rt, trainjob(trainer={"resourcesPerNode": override}),
                resources=want)


MERGE_CASES = [
    _merge_case("gpu only overlays runtime cpu and memory",
                {"limits": {"cpu": "8", "memory": "32Gi"}},
                {"limits": {"nvidia.com/gpu": "4"}},
                {"limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"}}),
    _merge_case("trainjob cpu overrides runtime cpu", {"limits": {"cpu": "8"}},
                {"limits": {"cpu": "4"}}, {"limits": {"cpu": "4"}}),
    _merge_case("partial override keeps other runtime keys",
                {"limits": {"cpu": "5", "memory": "32Gi"}},
                {"limits": {"nvidia.com/gpu": "2", "memory": "1Gi"}},
                {"limits": {"cpu": "5", "memory": "1Gi", "nvidia.com/gpu": "2"}}),
    _merge_case("empty override returns base", {"requests": {"cpu": "1"}}, {},
                {"requests": {"cpu": "1"}}),
    _merge_case("trainjob requests override runtime requests",
                {"requests": {"cpu": "8", "memory": "32Gi"}}, {"requests": {"cpu": "4"}},
                {"requests": {"cpu": "4", "memory": "32Gi"}}),
    _merge_case("trainjob claims override runtime claims by name",
                {"claims": [{"name": "gpu", "request": "default"}]},
                {"claims": [{"name": "gpu", "request": "large"}]},
                {"claims": [{"name": "gpu", "request": "large"}]}),
    _merge_case("trainjob claims merge keeps other runtime claims",
                {"claims": [{"name": "gpu", "request": "default"},
                            {"name": "storage", "request": "fast"}]},
                {"claims": [{"name": "gpu", "request": "large"}]},
                {"claims": [{"name": "gpu", "request": "large"},
                            {"name": "storage", "request": "fast"}]}),
    _merge_case("unset override claims keep runtime claims",
                {"claims": [{"name": "gpu", "request": "default"}]},
                {"limits": {"cpu": "4"}},
                {"limits": {"cpu": "4"}, "claims": [{"name": "gpu", "request": "default"}]}),
    Case(f"{CORE}: merged resourcesPerNode keeps runtime resources when trainjob sets gpu "
         "only",
         runtime(with_torch=False, jobs=[pod_job("node", resources={"requests": {"cpu": "1"}})]),
         trainjob(trainer={"numNodes": 1, "resourcesPerNode": {
             "limits": {"nvidia.com/gpu": "4"}}}),
         pods={"node": 1},
         resources={"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "4"}}),
]

MANIFEST_CASES = ENFORCE_CASES + VALIDATE_CASES + MERGE_CASES


@pytest.mark.parametrize("case", MANIFEST_CASES, ids=[c.id.split(": ", 2)[-1]
                                                      for c in MANIFEST_CASES])
def test_merge_agrees_with_upstreams_case(case):
    assert observed(case) == expected(case)


# -- torchtune_test.go: the `tune run` choice, case by case -------------------------------

MODEL_CASES = [  # TestGetModelFromRuntimeRef
    ("llama3.2 1B is normalized", "torchtune-llama3.2-1b", "llama3_2/1B"),
    ("qwen2.5 1.5B is normalized", "torchtune-qwen2.5-1.5b", "qwen2_5/1.5B"),
    ("fewer than three parts returns empty", "torchtune-llama3.2", ""),
    ("more than three parts returns empty", "torchtune-llama3.2-1b-extra", ""),
    ("empty name returns empty", "", ""),
]


@pytest.mark.parametrize("name, runtime_name, model", MODEL_CASES,
                         ids=[c[0] for c in MODEL_CASES])
def test_model_from_runtime_name_agrees(name, runtime_name, model):
    assert tune_model(runtime_name) == model


LORA = ["model.lora_attn_modules=['q_proj']"]
QLORA = ["model.quantize_base=True"]
RECIPE_CASES = [  # TestGetRecipeAndConfig: (nodes, numProcPerNode, GPUs, args) -> choice
    ("single device full", 1, "auto", 1, [], "full_finetune_single_device",
     "_full_single_device"),
    ("single device lora", 1, "auto", 1, LORA, "lora_finetune_single_device",
     "_lora_single_device"),
    ("single device qlora", 1, "auto", 1, QLORA, "lora_finetune_single_device",
     "_qlora_single_device"),
    ("single node multi-gpu full", 1, "auto", 4, [], "full_finetune_distributed", "_full"),
    ("single node multi-gpu lora", 1, "auto", 4, LORA, "lora_finetune_distributed", "_lora"),
    ("single node multi-gpu qlora", 1, "auto", 4, QLORA, "lora_finetune_distributed",
     "_qlora"),
    ("multi-node full", 2, "auto", 8, [], "full_finetune_distributed", "_full_multinode"),
    ("numProcPerNode=1 forces single device even with multiple gpus", 1, 1, 4, [],
     "full_finetune_single_device", "_full_single_device"),
    ("numProcPerNode>1 uses distributed", 1, 4, 4, [], "full_finetune_distributed", "_full"),
]


@pytest.mark.parametrize("name, nodes, nproc, gpus, args, recipe, suffix", RECIPE_CASES,
                         ids=[c[0] for c in RECIPE_CASES])
def test_recipe_and_config_agree(name, nodes, nproc, gpus, args, recipe, suffix):
    assert tune_recipe_and_config(nodes, nproc, gpus, args, "torchtune-llama3.2-1b") == \
        (recipe, "llama3_2/1B" + suffix)


# TestIsLoraConfigEnabled and TestIsUseQLoraFinetune, seen where they act: the config a
# single-device run gets (_lora_single_device, _qlora_single_device or full).
ARG_CASES = [
    ("TestIsLoraConfigEnabled: lora attn modules present",
     ["batch_size=32", "model.lora_attn_modules=['q_proj','v_proj']"], "_lora_single_device"),
    ("TestIsLoraConfigEnabled: no lora args", ["batch_size=32", "epochs=10"],
     "_full_single_device"),
    ("TestIsLoraConfigEnabled: empty args", [], "_full_single_device"),
    ("TestIsUseQLoraFinetune: quantize base enabled", QLORA, "_qlora_single_device"),
    ("TestIsUseQLoraFinetune: quantize base explicitly disabled",
     ["model.quantize_base=False"], "_full_single_device"),
    ("TestIsUseQLoraFinetune: dora short-circuits even when quantize base is set",
     ["model.quantize_base=True", "model.use_dora=True"], "_full_single_device"),
    ("TestIsUseQLoraFinetune: dora explicitly disabled with quantize base set",
     ["model.quantize_base=True", "model.use_dora=False"], "_qlora_single_device"),
    ("TestIsUseQLoraFinetune: neither quantize base nor dora", ["batch_size=32"],
     "_full_single_device"),
    ("TestIsUseQLoraFinetune: empty args", [], "_full_single_device"),
]


@pytest.mark.parametrize("name, args, suffix", ARG_CASES, ids=[c[0] for c in ARG_CASES])
def test_lora_and_qlora_args_are_read_alike(name, args, suffix):
    assert tune_recipe_and_config(1, "auto", 1, args, "torchtune-llama3.2-1b")[1] == \
        "llama3_2/1B" + suffix


# TestExtractOverridesFromRuntime, seen where it acts: the node's completed `tune run`
# carries the runtime's immutable entries, from the trainer job's node container only.
IMMUTABLE_COMMAND = ["output_dir=/out", "tokenizer.path=/tok", "batch_size=32"]
OVERRIDE_CASES = [
    ("no jobset template", [pod_job("node")], []),
    ("trainer node container returns only immutable configs",
     [pod_job("node", commands={"node": IMMUTABLE_COMMAND})],
     ["output_dir=/out", "tokenizer.path=/tok"]),
    ("non-trainer ancestor is ignored",
     [pod_job("node"), pod_job("other", ancestor="other",
                               commands={"node": IMMUTABLE_COMMAND})], []),
    ("non-node container is ignored",
     [pod_job("node", containers=("sidecar", "node"),
              commands={"sidecar": IMMUTABLE_COMMAND})], []),
]


@pytest.mark.parametrize("name, jobs, carried", OVERRIDE_CASES,
                         ids=[c[0] for c in OVERRIDE_CASES])
def test_runtime_paths_carried_into_tune_run_agree(name, jobs, carried):
    jobset = merge(runtime("torchtune-llama3.2-1b", jobs=jobs),
                   trainjob(trainer={"command": ["tune", "run"], "numProcPerNode": 1},
                            runtime_name="torchtune-llama3.2-1b"))
    node = next(c for j in jobset["spec"]["replicatedJobs"] if j["name"] == "node"
                for c in j["template"]["spec"]["template"]["spec"]["containers"]
                if c["name"] == "node")
    assert node["command"] == ["tune", "run", "full_finetune_single_device", "--config",
                               "llama3_2/1B_full_single_device", *carried]


def test_every_applicable_upstream_case_is_replayed():
    ids = [c.id for c in MANIFEST_CASES] + [f"{TUNE}: {c[0]}" for c in
                                             MODEL_CASES + RECIPE_CASES + ARG_CASES +
                                             OVERRIDE_CASES]
    assert len(set(ids)) == len(ids) == EXPECTED_CASES
    assert not set(ids) & set(NOT_APPLICABLE)
