"""Write every ClusterTrainingRuntime, from one description each: our `kubetune-*`
runtimes to runtimes/base/, the `torchtune-*` drop-ins for upstream's runtimes (same
names: applying them replaces upstream's) to runtimes/overlays/dropin/, an opt-in.

The runtimes share their security context, failure policy, volumes and exporter step;
writing them from one place keeps those identical. Run `python runtimes/generate.py`
after editing; tests/test_runtimes_manifests.py fails while the files are stale.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

BASE = Path(__file__).resolve().parent / "base"
DROPIN = Path(__file__).resolve().parent / "overlays" / "dropin"
DROPIN_PREFIX = "torchtune-"
REGISTRY = "ghcr.io/kubetune"
VERSION = "0.1.0"
INITIALIZER_IMAGE = f"{REGISTRY}/initializer:{VERSION}"
TRAINER_IMAGE = f"{REGISTRY}/trainer:{VERSION}"
EXPORTER_IMAGE = f"{REGISTRY}/exporter:{VERSION}"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
# Which replicatedJobs a runtime has, for kustomize components that target a step:
# "staged" (dataset-initializer, model-initializer, node, exporter), "staged-teacher"
# (a teacher-initializer after the model's: distillation) or "gang" (node alone, running
# every step; see gang_runtime).
LAYOUT = "kubetune.io/layout"
UID = 65532
# Exit codes (kubetune/errors.py): usage, bad input and internal errors fail for good;
# everything else (75 transient, 76 a recipe killed by a signal such as the OOM killer's,
# a crash, a kill) is counted and may be restarted: the restart resumes from the last
# resumable checkpoint.
FINAL_EXIT_CODES = [2, 65, 70]
RESTARTABLE_EXIT_CODES = [75, 76]
MAX_RESTARTS = 3
DEFAULT_DATASET = "hf://tatsu-lab/alpaca"


@dataclass
class Spec:
    name: str
    description: str
    framework: str
    model_uri: str | None  # None: the TrainJob must name the model
    dataset_uri: str | None
    node_command: list[str]
    gpus: int
    memory: str
    cpu: str
    shm: str
    storage: str
    num_nodes: int = 1
    node_args: list[str] | None = None
    node_env: list[dict] = field(default_factory=list)
    access_mode: str = "ReadWriteOnce"
    gang: bool = False
    exporter: bool = True
    # Distillation: the teacher model, fetched by the model initializer into
    # /workspace/teacher (kubetune.workspace.TEACHER_PATH) as a third initializer.
    teacher_uri: str | None = None


def _tune_dropin(config: str, tokenizer: list[str]) -> list[str]:
    # Upstream's form: the controller keeps only output_dir, tokenizer.*, and
    # checkpointer.checkpoint_dir from this command when the TrainJob says `tune run`.
    return ["tune", "run", "--rdzv_endpoint=localhost:29500", "full_finetune_distributed",
            "--config", config, "output_dir=/workspace/output", *tokenizer,
            "checkpointer.checkpoint_dir=/workspace/model"]


LLAMA_TOKENIZER = ["tokenizer.path=/workspace/model/original/tokenizer.model"]
QWEN_TOKENIZER = ["tokenizer.path=/workspace/model/vocab.json",
                  "tokenizer.merges_file=/workspace/model/merges.txt"]


def _env(**values: str) -> list[dict]:
    return [{"name": k, "value": v} for k, v in values.items()]


TRAIN = ["kubetune", "train"]
RUNTIMES = [
    Spec("torchtune-llama3.2-1b", "Llama-3.2-1B-Instruct, torchtune recipes (drop-in for "
         "upstream's runtime: SDK BuiltinTrainer / `tune run` TrainJobs)", "torchtune",
         "hf://meta-llama/Llama-3.2-1B-Instruct", DEFAULT_DATASET,
         _tune_dropin("llama3_2/1B_full", LLAMA_TOKENIZER), gpus=2, memory="64Gi", cpu="8",
         shm="8Gi", storage="50Gi"),
    Spec("torchtune-llama3.2-3b", "Llama-3.2-3B-Instruct, torchtune recipes (drop-in)",
         "torchtune", "hf://meta-llama/Llama-3.2-3B-Instruct", DEFAULT_DATASET,
         _tune_dropin("llama3_2/3B_full", LLAMA_TOKENIZER), gpus=2, memory="96Gi", cpu="8",
         shm="16Gi", storage="80Gi"),
    Spec("torchtune-qwen2.5-1.5b", "Qwen2.5-1.5B-Instruct, torchtune recipes (drop-in)",
         "torchtune", "hf://Qwen/Qwen2.5-1.5B-Instruct", DEFAULT_DATASET,
         _tune_dropin("qwen2_5/1.5B_full", QWEN_TOKENIZER), gpus=2, memory="64Gi", cpu="8",
         shm="8Gi", storage="50Gi"),
    Spec("torchtune-llama3.3-70b", "Llama-3.3-70B-Instruct, torchtune recipes (drop-in; "
         "the only model the controller lets run on several nodes: give the PVC a "
         "ReadWriteMany storage class for that)", "torchtune",
         "hf://meta-llama/Llama-3.3-70B-Instruct", DEFAULT_DATASET,
         _tune_dropin("llama3_3/70B_full", LLAMA_TOKENIZER), gpus=8, memory="1200Gi",
         cpu="64", shm="64Gi", storage="600Gi"),
    Spec("kubetune-llama3.1-8b-lora", "Llama-3.1-8B-Instruct, LoRA, one GPU (kubetune train)",
         "kubetune", "hf://meta-llama/Llama-3.1-8B-Instruct", DEFAULT_DATASET, TRAIN, gpus=1,
         memory="64Gi", cpu="8", shm="8Gi", storage="100Gi",
         node_env=_env(KUBETUNE_METHOD="lora", KUBETUNE_LORA_RANK="16",
                       KUBETUNE_LORA_ALPHA="32", KUBETUNE_EPOCHS="1")),
    Spec("kubetune-qwen2.5-7b-qlora", "Qwen2.5-7B-Instruct, QLoRA (4-bit base), one GPU "
         "(kubetune train)", "kubetune", "hf://Qwen/Qwen2.5-7B-Instruct", DEFAULT_DATASET,
         TRAIN, gpus=1, memory="48Gi", cpu="8", shm="8Gi", storage="80Gi",
         node_env=_env(KUBETUNE_METHOD="qlora", KUBETUNE_LORA_RANK="16",
                       KUBETUNE_LORA_ALPHA="32", KUBETUNE_EPOCHS="1")),
    Spec("kubetune-mistral-7b-lora", "Mistral-7B-Instruct-v0.3, LoRA, one GPU "
         "(kubetune train)", "kubetune", "hf://mistralai/Mistral-7B-Instruct-v0.3",
         DEFAULT_DATASET, TRAIN, gpus=1, memory="64Gi", cpu="8", shm="8Gi", storage="80Gi",
         node_env=_env(KUBETUNE_METHOD="lora", KUBETUNE_LORA_RANK="16",
                       KUBETUNE_LORA_ALPHA="32", KUBETUNE_EPOCHS="1")),
    Spec("kubetune-gemma-7b-lora", "Gemma-7B-it, LoRA, one GPU (kubetune train)", "kubetune",
         "hf://google/gemma-7b-it", DEFAULT_DATASET, TRAIN, gpus=1, memory="64Gi", cpu="8",
         shm="8Gi", storage="80Gi",
         node_env=_env(KUBETUNE_METHOD="lora", KUBETUNE_LORA_RANK="16",
                       KUBETUNE_LORA_ALPHA="32", KUBETUNE_EPOCHS="1")),
    Spec("kubetune-qwen3-8b-lora", "Qwen3-8B, LoRA, one GPU (kubetune train; torchtune "
         "0.6.1 has no Qwen3: kubetune's builder on torchtune's modules)", "kubetune",
         "hf://Qwen/Qwen3-8B", DEFAULT_DATASET, TRAIN, gpus=1, memory="64Gi", cpu="8",
         shm="8Gi", storage="100Gi",
         node_env=_env(KUBETUNE_METHOD="lora", KUBETUNE_LORA_RANK="16",
                       KUBETUNE_LORA_ALPHA="32", KUBETUNE_EPOCHS="1")),
    Spec("kubetune-llama3.1-8b-dpo-lora", "Llama-3.1-8B-Instruct, preference tuning (DPO) "
         "with LoRA, one GPU (kubetune train --objective dpo; data: prompt/chosen/rejected "
         "pairs, docs/trainer.md#preference-tuning-dpo)", "kubetune",
         "hf://meta-llama/Llama-3.1-8B-Instruct", "hf://trl-lib/ultrafeedback_binarized",
         TRAIN, gpus=1, memory="64Gi", cpu="8", shm="8Gi", storage="100Gi",
         node_env=_env(KUBETUNE_METHOD="lora", KUBETUNE_OBJECTIVE="dpo",
                       KUBETUNE_LORA_RANK="16", KUBETUNE_LORA_ALPHA="32",
                       KUBETUNE_EPOCHS="1")),
    Spec("kubetune-llama3.2-1b-distill-lora", "Llama-3.2-1B-Instruct distilled from "
         "Llama-3.1-8B-Instruct (knowledge distillation, LoRA student), one GPU (kubetune "
         "train --objective distill; the teacher: a third initializer into "
         "/workspace/teacher, docs/trainer.md#distillation)", "kubetune",
         "hf://meta-llama/Llama-3.2-1B-Instruct", DEFAULT_DATASET, TRAIN, gpus=1,
         memory="64Gi", cpu="8", shm="8Gi", storage="100Gi",
         node_env=_env(KUBETUNE_METHOD="lora", KUBETUNE_OBJECTIVE="distill",
                       KUBETUNE_LORA_RANK="16", KUBETUNE_LORA_ALPHA="32",
                       KUBETUNE_EPOCHS="1"),
         teacher_uri="hf://meta-llama/Llama-3.1-8B-Instruct"),
    Spec("kubetune-byo-model", "Bring your own model: model and dataset only from the "
         "TrainJob (spec.initializer), method from KUBETUNE_METHOD (default lora)",
         "kubetune", None, None, TRAIN, gpus=1, memory="64Gi", cpu="8", shm="8Gi",
         storage="100Gi", node_env=_env(KUBETUNE_METHOD="lora")),
]


def _security(read_only: bool = True) -> dict:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": read_only,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def _pod_security() -> dict:
    return {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
            "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}


def _failure_policy(container: str, backoff_limit: int) -> dict:
    return {
        # Job-level: a pod retry costs seconds for an initializer or the exporter; the
        # trainer gets none (its ranks cannot rejoin one at a time: the JobSet restarts
        # the gang instead, and the initializers find their output and skip).
        "backoffLimit": backoff_limit,
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {
                "containerName": container, "operator": "In", "values": FINAL_EXIT_CODES}},
            {"action": "Count", "onExitCodes": {
                "containerName": container, "operator": "In",
                "values": RESTARTABLE_EXIT_CODES}},
            # Evictions and preemptions are not the step's fault.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget",
                                                      "status": "True"}]},
        ]},
    }


def _tmp_volume(size: str = "2Gi") -> dict:
    return {"name": "tmp", "emptyDir": {"sizeLimit": size}}


MOUNTS = [{"name": "initializer", "mountPath": "/workspace"},
          {"name": "tmp", "mountPath": "/tmp"}]


def _job(name: str, ancestor: str | None, container: dict, backoff_limit: int,
         volumes: list[dict], depends_on: list[str] | None = None,
         pod_meta: dict | None = None) -> dict:
    container = {**container, "securityContext": _security(),
                 "terminationMessagePolicy": "FallbackToLogsOnError"}
    job: dict = {"name": name}
    if depends_on:
        job["dependsOn"] = [{"name": d, "status": "Complete"} for d in depends_on]
    template: dict = {}
    if ancestor:
        template["metadata"] = {"labels": {ANCESTOR: ancestor}}
    pod: dict = {}
    if pod_meta:
        pod["metadata"] = pod_meta
    pod["spec"] = {"restartPolicy": "Never", "securityContext": _pod_security(),
                   "containers": [container], "volumes": volumes}
    template["spec"] = {**_failure_policy(container["name"], backoff_limit), "template": pod}
    job["template"] = template
    return job


def _initializer(kind: str, uri: str | None) -> dict:
    name = f"{kind}-initializer"
    container: dict = {"name": name, "image": INITIALIZER_IMAGE,
                       "command": ["kubetune", f"init-{kind}"]}
    if uri:
        container["env"] = _env(STORAGE_URI=uri)
    container["resources"] = {"requests": {"cpu": "2", "memory": "4Gi"},
                              "limits": {"memory": "8Gi"}}
    container["volumeMounts"] = MOUNTS
    return _job(name, name, container, backoff_limit=2, volumes=[_tmp_volume()])


def _teacher_initializer(uri: str) -> dict:
    # No ancestor label: the controller's TrainJob initializer overrides (spec.initializer
    # .model) are the student's; the teacher's URI is the runtime's (or a runtimePatch's).
    container: dict = {"name": "teacher-initializer", "image": INITIALIZER_IMAGE,
                       "command": ["kubetune", "init-model"],
                       "env": _env(STORAGE_URI=uri, OUTPUT_PATH="/workspace/teacher"),
                       "resources": {"requests": {"cpu": "2", "memory": "4Gi"},
                                     "limits": {"memory": "8Gi"}},
                       "volumeMounts": MOUNTS}
    return _job("teacher-initializer", None, container, backoff_limit=2,
                volumes=[_tmp_volume()])


def _node(spec: Spec) -> dict:
    container: dict = {"name": "node", "image": TRAINER_IMAGE, "command": spec.node_command}
    if spec.node_args:
        container["args"] = spec.node_args
    if spec.node_env:
        container["env"] = spec.node_env
    container["resources"] = {
        "requests": {"cpu": spec.cpu, "memory": spec.memory, "nvidia.com/gpu": spec.gpus},
        "limits": {"memory": spec.memory, "nvidia.com/gpu": spec.gpus}}
    container["volumeMounts"] = [*MOUNTS, {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes = [_tmp_volume("20Gi"),
               # NCCL and DataLoader workers share memory through /dev/shm (64Mi by default).
               {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm}}]
    teacher = ["teacher-initializer"] if spec.teacher_uri else []
    return _job("node", "trainer", container, backoff_limit=0, volumes=volumes,
                depends_on=["dataset-initializer", "model-initializer", *teacher])


def _exporter() -> dict:
    container = {"name": "exporter", "image": EXPORTER_IMAGE, "command": ["kubetune", "export"],
                 # The destination: a TrainJob changes it with a runtimePatch (docs/runtimes.md).
                 "env": _env(EXPORT_URI="/workspace/export"),
                 "resources": {"requests": {"cpu": "2", "memory": "16Gi"},
                               "limits": {"memory": "32Gi"}},
                 "volumeMounts": MOUNTS}
    return _job("exporter", None, container, backoff_limit=2, volumes=[_tmp_volume()],
                depends_on=["node"])


def runtime(spec: Spec) -> dict:
    jobs = [_initializer("dataset", spec.dataset_uri), _initializer("model", spec.model_uri),
            *([_teacher_initializer(spec.teacher_uri)] if spec.teacher_uri else []),
            _node(spec)]
    if spec.exporter:
        jobs.append(_exporter())
    body: dict = {
        "mlPolicy": {"numNodes": spec.num_nodes, "torch": {}},
        "template": {"spec": {
            "volumeClaimPolicies": [{"templates": [{
                "metadata": {"name": "initializer"},
                "spec": {"accessModes": [spec.access_mode],
                         "resources": {"requests": {"storage": spec.storage}}}}]}],
            "failurePolicy": {"maxRestarts": MAX_RESTARTS, "rules": [
                {"name": "BadInputIsFinal", "action": "FailJobSet",
                 "onJobFailureReasons": ["PodFailurePolicy"]},
                {"name": "TransientRestartsAll", "action": "RestartJobSet",
                 "onJobFailureReasons": ["BackoffLimitExceeded"]},
            ]},
            "replicatedJobs": jobs,
        }},
    }
    if spec.gang:
        body = {"mlPolicy": body["mlPolicy"],
                "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 300}},
                "template": body["template"]}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": spec.name,
                         "labels": {"trainer.kubeflow.org/framework": spec.framework,
                                    LAYOUT: "staged-teacher" if spec.teacher_uri
                                    else "staged"},
                         "annotations": {"kubetune.io/description": spec.description}},
            "spec": body}


def gang_runtime() -> dict:
    """Multi-node full fine-tune, gang-scheduled.

    The PodGroup the controller creates counts every pod of every replicatedJob, and a
    job's pods exist only once the jobs it depends on completed: with separate
    initializer and exporter jobs the gang could never fill and nothing would start. So
    here the gang is the trainer nodes alone, each of which runs the initializers first
    (to node-local disk: every node reads its own copy) and, on node 0, the exporter last.
    Sources come from the trainer env (MODEL_URI, DATASET_URI, EXPORT_URI).
    """
    script = "\n".join([
        "set -e",
        # The controller sets PET_* only for a TrainJob with spec.trainer: without it
        # every node would think itself alone. Bad input, so 65: not restarted.
        '[ -n "${PET_NNODES:-}" ] || { echo "error: node: no PET_NNODES: the TrainJob '
        'needs spec.trainer (numNodes) for the controller to set the torch env" >&2; '
        'exit 65; }',
        'kubetune init-model --storage-uri "$MODEL_URI"',
        'kubetune init-dataset --storage-uri "$DATASET_URI"',
        "tune run --nnodes=\"$PET_NNODES\" --nproc_per_node=\"$PET_NPROC_PER_NODE\" "
        "--node_rank=\"$PET_NODE_RANK\" --rdzv_endpoint=\"$PET_MASTER_ADDR:$PET_MASTER_PORT\" "
        "full_finetune_distributed --config llama3_1/8B_full "
        "output_dir=/workspace/output checkpointer.checkpoint_dir=/local/model "
        "tokenizer.path=/local/model/original/tokenizer.model \"$@\"",
        'if [ "$PET_NODE_RANK" = 0 ]; then',
        "  kubetune export",
        "fi",
    ])
    container = {
        "name": "node", "image": TRAINER_IMAGE, "command": ["/bin/sh", "-c", script, "node"],
        # Model and dataset on node-local disk, for every step of this container.
        "env": _env(MODEL_URI="hf://meta-llama/Llama-3.1-8B-Instruct",
                    DATASET_URI=DEFAULT_DATASET, EXPORT_URI="/workspace/export",
                    KUBETUNE_MODEL_DIR="/local/model", KUBETUNE_DATASET_DIR="/local/dataset"),
        # Sized for the 8B model, not for a particular node type: 8 ranks each holding a
        # bf16 copy while loading (~16Gi) plus the 64Gi /dev/shm, which counts against
        # this limit. A TrainJob's resourcesPerNode changes it.
        "resources": {"requests": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 8},
                      "limits": {"memory": "256Gi", "nvidia.com/gpu": 8}},
        "volumeMounts": [*MOUNTS, {"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "local", "mountPath": "/local"}],
    }
    volumes = [_tmp_volume("20Gi"),
               {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
               {"name": "local", "emptyDir": {"sizeLimit": "200Gi"}}]
    # No schedulerName: where the coscheduling plugin runs in a second scheduler
    # (scheduler-plugins' chart), runtimes/components/scheduler-name names it.
    node = _job("node", "trainer", container, backoff_limit=0, volumes=volumes)
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "kubetune-llama3.1-8b-full-multinode",
                         "labels": {"trainer.kubeflow.org/framework": "kubetune",
                                    LAYOUT: "gang"},
                         "annotations": {"kubetune.io/description": (
                             "Llama-3.1-8B-Instruct, full fine-tune on 2 nodes x 8 GPUs, "
                             "gang-scheduled (scheduler-plugins coscheduling); output on a "
                             "ReadWriteMany PVC")}},
            "spec": {
                "mlPolicy": {"numNodes": 2, "torch": {}},
                "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 300}},
                "template": {"spec": {
                    "volumeClaimPolicies": [{"templates": [{
                        "metadata": {"name": "initializer"},
                        "spec": {"accessModes": ["ReadWriteMany"],
                                 "resources": {"requests": {"storage": "200Gi"}}}}]}],
                    "failurePolicy": {"maxRestarts": MAX_RESTARTS, "rules": [
                        {"name": "BadInputIsFinal", "action": "FailJobSet",
                         "onJobFailureReasons": ["PodFailurePolicy"]},
                        {"name": "TransientRestartsAll", "action": "RestartJobSet",
                         "onJobFailureReasons": ["BackoffLimitExceeded"]},
                    ]},
                    "replicatedJobs": [node],
                }},
            }}


def documents() -> dict[str, dict]:
    """File name -> runtime, for every runtime."""
    docs = {f"{s.name}.yaml": runtime(s) for s in RUNTIMES}
    gang = gang_runtime()
    docs[f"{gang['metadata']['name']}.yaml"] = gang
    return docs


HEADER = "# Generated by runtimes/generate.py: edit that file, then run it.\n"


class _Dumper(yaml.SafeDumper):
    # Shared Python objects must not become YAML anchors: a reader edits one place.
    def ignore_aliases(self, data) -> bool:
        return True


def render(doc: dict) -> str:
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100)


def kustomization(names: list[str], comment: str = "") -> str:
    return HEADER + comment + yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": sorted(names)}, sort_keys=False)


DROPIN_COMMENT = """\
# Opt-in: these runtimes carry upstream Kubeflow Trainer's torchtune-* names, so applying
# them REPLACES upstream's runtimes of those names (SDK BuiltinTrainer TrainJobs then run
# kubetune's images). Apply on purpose, beside runtimes/base:
#   kubectl apply --server-side --force-conflicts -k runtimes/overlays/dropin
"""


def directory(file_name: str) -> Path:
    """Where a runtime's file lives: drop-ins apart from the base."""
    return DROPIN if file_name.startswith(DROPIN_PREFIX) else BASE


def main() -> int:
    docs = documents()
    for folder in (BASE, DROPIN):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.yaml"):
            if old.name != "kustomization.yaml" and (
                    old.name not in docs or directory(old.name) != folder):
                old.unlink()
    for name, doc in docs.items():
        (directory(name) / name).write_text(render(doc))
    (BASE / "kustomization.yaml").write_text(
        kustomization([n for n in docs if directory(n) == BASE]))
    (DROPIN / "kustomization.yaml").write_text(
        kustomization([n for n in docs if directory(n) == DROPIN], DROPIN_COMMENT))
    print(f"wrote {len(docs)} runtimes to {BASE} and {DROPIN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
