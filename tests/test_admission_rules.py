"""Kubeflow Trainer v2.3's TrainJob admission rules, as `kubetune local` holds them
(kubetune/tools/local/admission_rules.py): everything our docs tell a user to send is
admitted by the runtime it names, and each rule rejects with upstream's field error."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from kubetune.errors import BadInputError
from kubetune.tools.local.admission_rules import RULES
from kubetune.tools.local.runtime_merge import merge
from tests.support.runtimes import BASE, DROPIN, REPO, runtime_file
from tests.support.sdk_trainjob import sdk_container_trainjob_spec, sdk_runtime

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")

TRAINER_IMAGE = "ghcr.io/kubetune/trainer:0.1.0"


def runtime(name: str) -> dict:
    return yaml.safe_load(runtime_file(name).read_text())


# -- what the docs tell users to send ---------------------------------------------------

def _trainjobs_in(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)
            and d.get("kind") == "TrainJob"]


def documented_yaml_trainjobs() -> list[tuple[str, dict]]:
    """(where, TrainJob) for each TrainJob in a YAML file we ship under examples/ or
    runtimes/, and each fenced yaml block of kind TrainJob in README.md and docs/*.md."""
    found = []
    for folder in ("examples", "runtimes"):
        for path in sorted((REPO / folder).rglob("*.y*ml")):
            for i, job in enumerate(_trainjobs_in(path.read_text())):
                found.append((f"{path.relative_to(REPO)}#{i}", job))
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
    for doc in (d for d in docs if d.is_file()):
        blocks = re.findall(r"^```ya?ml\n(.*?)^```", doc.read_text(), re.M | re.S)
        for i, block in enumerate(blocks):
            for job in _trainjobs_in(block):
                found.append((f"{doc.relative_to(REPO)} yaml block {i}", job))
    return found


def _sdk_spec(runtime_name: str, trainer, initializer=None) -> dict:
    """The TrainJob spec the SDK's `TrainerClient().train()` submits (its own
    `_get_trainjob_spec`, given the Runtime object `get_runtime` would return)."""
    from kubeflow.trainer.backends.kubernetes.backend import KubernetesBackend

    return KubernetesBackend._get_trainjob_spec(
        None, runtime=sdk_runtime(runtime_file(runtime_name)), initializer=initializer,
        trainer=trainer).to_dict()


def _hub_initializer(model: str, dataset: str = "hf://tatsu-lab/alpaca/data"):
    from kubeflow.trainer import (HuggingFaceDatasetInitializer, HuggingFaceModelInitializer,
                                  Initializer)

    return Initializer(dataset=HuggingFaceDatasetInitializer(storage_uri=dataset),
                       model=HuggingFaceModelInitializer(storage_uri=model,
                                                         access_token="hf_example"))


def sdk_builtin_trainer(runtime_name: str) -> dict:
    """README "Drop-in family": BuiltinTrainer with LoRA on a drop-in runtime ("set
    runtimeRef.name to another drop-in runtime to change the model")."""
    from kubeflow.trainer import BuiltinTrainer, LoraConfig, TorchTuneConfig

    return _sdk_spec(runtime_name, BuiltinTrainer(config=TorchTuneConfig(
        epochs=1, peft_config=LoraConfig(lora_rank=16, lora_alpha=32,
                                         lora_attn_modules=["q_proj", "v_proj"]))),
        _hub_initializer("hf://meta-llama/Llama-3.2-1B-Instruct"))


def sdk_direct_trainer(runtime_name: str) -> dict:
    """README "Direct family": CustomTrainerContainer that keeps the runtime's command."""
    from kubeflow.trainer import CustomTrainerContainer

    return _sdk_spec(runtime_name, CustomTrainerContainer(image=TRAINER_IMAGE,
                                                          env={"KUBETUNE_EPOCHS": "2"}))


def sdk_multinode_trainer() -> dict:
    from kubeflow.trainer import CustomTrainerContainer

    return _sdk_spec("kubetune-llama3.1-8b-full-multinode", CustomTrainerContainer(
        image=TRAINER_IMAGE, num_nodes=3, env={"DATASET_URI": "hf://tatsu-lab/alpaca"}))


def sdk_any_model(model: str) -> dict:
    """README "Any model from the SDK": the snippet as written, for Qwen3 and Gemma 2."""
    spec = sdk_container_trainjob_spec(
        runtime_file("kubetune-byo-model"), model, "hf://tatsu-lab/alpaca",
        {"KUBETUNE_METHOD": "lora", "KUBETUNE_LORA_RANK": "8", "KUBETUNE_LORA_ALPHA": "16",
         "KUBETUNE_LORA_TARGET_MODULES": "all-linear"},
        {"gpu": 1, "cpu": 8, "memory": "32Gi"})
    return {"runtimeRef": {"name": "kubetune-byo-model", "kind": "ClusterTrainingRuntime"},
            **spec}


DROPINS = sorted(p.stem for p in DROPIN.glob("torchtune-*.yaml"))
DIRECT = sorted(p.stem for p in BASE.glob("kubetune-*.yaml")
                if p.stem not in ("kubetune-byo-model", "kubetune-llama3.1-8b-full-multinode"))
SDK_TRAINJOBS = {
    **{f"sdk BuiltinTrainer {name}": (lambda n=name: sdk_builtin_trainer(n))
       for name in DROPINS},
    **{f"sdk CustomTrainerContainer {name}": (lambda n=name: sdk_direct_trainer(n))
       for name in DIRECT},
    "sdk CustomTrainerContainer multi-node": sdk_multinode_trainer,
    "sdk any model qwen3": lambda: sdk_any_model("hf://Qwen/Qwen3-4B"),
    "sdk any model gemma2": lambda: sdk_any_model("hf://google/gemma-2-2b-it"),
}


def test_the_docs_have_trainjobs_to_check():
    # Guards the collection: a moved folder or a changed fence must not leave it empty.
    where = [w for w, _ in documented_yaml_trainjobs()]
    shipped = {p.relative_to(REPO).as_posix()
               for p in (REPO / "examples" / "trainjobs").glob("*.yaml")}
    assert shipped and shipped <= {w.split("#")[0] for w in where}
    assert any(".md yaml block" in w for w in where)
    assert len(DROPINS) == 4 and DIRECT


@pytest.mark.parametrize("where, trainjob", documented_yaml_trainjobs(),
                         ids=[w for w, _ in documented_yaml_trainjobs()])
def test_documented_trainjob_is_admitted(where, trainjob):
    name = trainjob["spec"]["runtimeRef"]["name"]
    # A runtime of one's own (examples/own-runtime) sits beside its TrainJob, not in runtimes/.
    beside = (REPO / where.split("#")[0]).parent / "runtime.yaml"
    own = yaml.safe_load(beside.read_text()) if beside.is_file() else None
    merge(own if own and own["metadata"]["name"] == name else runtime(name), trainjob)


@pytest.mark.parametrize("what", sorted(SDK_TRAINJOBS))
def test_trainjob_the_sdk_builds_for_a_documented_path_is_admitted(what):
    spec = SDK_TRAINJOBS[what]()
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": "sdk"}, "spec": spec}
    merge(runtime(spec["runtimeRef"]["name"]), trainjob)


# -- each rule rejects, with upstream's message ------------------------------------------

def job(runtime_name: str, **spec) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "j"}, "spec": {"runtimeRef": {"name": runtime_name}, **spec}}


def tune(**trainer) -> dict:
    return {"command": ["tune", "run"], **trainer}


def patch(manager: str = "example.com/tool", job_name: str = "exporter",
          kind: str = "containers", **container) -> dict:
    """A runtime patch of one container (by default the job's own, unchanged)."""
    container = {"name": job_name, **container}
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": job_name, "template": {"spec": {"template": {"spec": {
            kind: [container]}}}}}]}}}}


def _jobs(rt: dict) -> dict:
    return {j["name"]: j for j in rt["spec"]["template"]["spec"]["replicatedJobs"]}


def _pod(rt: dict, name: str) -> dict:
    return _jobs(rt)[name]["template"]["spec"]["template"]["spec"]


def byo_renamed_dataset_container() -> dict:
    rt = runtime("kubetune-byo-model")
    _pod(rt, "dataset-initializer")["containers"][0]["name"] = "fetch"
    return rt


def byo_model_initializer_without_mounts() -> dict:
    rt = runtime("kubetune-byo-model")
    _pod(rt, "model-initializer")["containers"][0]["volumeMounts"] = []
    return rt


def byo_with_env_injection() -> dict:
    rt = runtime("kubetune-byo-model")
    rt["spec"]["mlPolicy"]["torch"]["envInjection"] = {
        "targets": [{"jobName": "node", "containerNames": ["node", "sidecar"]}]}
    return rt


BYO = "kubetune-byo-model"
QLORA = ["model.quantize_base=True", "model.lora_attn_modules=[q_proj,v_proj]"]
BYO_REF = '{"name":"kubetune-byo-model","apiGroup":"trainer.kubeflow.org",' \
          '"kind":"ClusterTrainingRuntime"}'
MULTI_REF = BYO_REF.replace("kubetune-byo-model", "kubetune-llama3.1-8b-full-multinode")
DOMAIN_RULE = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
               "characters, '-' or '.', and must start and end with an alphanumeric "
               "character (e.g. 'example.com', regex used for validation is "
               r"'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")


def _patches_json(*patches: dict) -> str:
    import json

    return json.dumps(list(patches), separators=(",", ":"))


# (rule ids, runtime (name or builder), TrainJob, upstream's message(s))
REJECTIONS = [
    (["runtime-name-matches"], "torchtune-llama3.2-1b", job("torchtune-llama3.2-3b"),
     ["TrainJob runtimeRef.name is 'torchtune-llama3.2-3b' but the runtime is "
      "'torchtune-llama3.2-1b'"]),
    (["runtime-kind-matches"], BYO,
     job(BYO) | {"spec": {"runtimeRef": {"name": BYO, "kind": "TrainingRuntime"}}},
     ["TrainJob runtimeRef.kind is 'TrainingRuntime' but the runtime is a "
      "ClusterTrainingRuntime"]),
    (["initializer-job"], "kubetune-llama3.1-8b-full-multinode",
     job("kubetune-llama3.1-8b-full-multinode",
         initializer={"dataset": {"storageUri": "hf://org/data"}}),
     [f"spec.runtimeRef: Invalid value: {MULTI_REF}: must have dataset-initializer job "
      "when trainJob is configured with input datasetConfig"]),
    (["initializer-container"], byo_renamed_dataset_container,
     job(BYO, initializer={"dataset": {"storageUri": "hf://org/data"}}),
     [f"spec.runtimeRef: Invalid value: {BYO_REF}: must have container with name - "
      "dataset-initializer in the dataset-initializer job"]),
    (["initializer-volume"], byo_model_initializer_without_mounts,
     job(BYO, initializer={"model": {"storageUri": "hf://org/model"}}),
     [f"spec.runtimeRef: Invalid value: {BYO_REF}: must have volumeMount with name - "
      "initializer in container model-initializer of the model-initializer job"]),
    (["patch-manager-required"], BYO, job(BYO, runtimePatches=[patch(manager="")]),
     ["spec.runtimePatches.manager: Required value"]),
    (["patch-manager-domain-prefixed"], BYO, job(BYO, runtimePatches=[patch(manager="tool")]),
     ['spec.runtimePatches.manager: Invalid value: "tool": must be a domain-prefixed path '
      '(such as "acme.io/foo")']),
    (["patch-manager-domain-length"], BYO,
     job(BYO, runtimePatches=[patch(manager="a" * 254 + "/tool")]),
     [f'spec.runtimePatches.manager: Invalid value: "{"a" * 254}": must be no more than '
      "253 characters"]),
    (["patch-manager-domain"], BYO,
     job(BYO, runtimePatches=[patch(manager="Example.com/tool")]),
     [f'spec.runtimePatches.manager: Invalid value: "Example.com": {DOMAIN_RULE}']),
    (["patch-manager-path"], BYO,
     job(BYO, runtimePatches=[patch(manager="example.com/my tool")]),
     ['spec.runtimePatches.manager: Invalid value: "my tool": Invalid path (regex used for '
      "validation is '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')"]),
    (["patch-replicated-job-exists"], BYO,
     job(BYO, runtimePatches=[patch(job_name="evaluator")]),
     ["spec.runtimePatches: Invalid value: "
      + _patches_json(patch(job_name="evaluator"))
      + ": must not have replicated job that doesn't exist in the runtime job template"]),
    (["patch-init-container-exists"], BYO,
     job(BYO, runtimePatches=[patch(job_name="node", kind="initContainers", name="warmup")]),
     ["spec.runtimePatches: Invalid value: "
      + _patches_json(patch(job_name="node", kind="initContainers", name="warmup"))
      + ": must not have initContainer that doesn't exist in the runtime job node"]),
    (["patch-container-exists"], BYO, job(BYO, runtimePatches=[patch(name="sidecar")]),
     ["spec.runtimePatches: Invalid value: " + _patches_json(patch(name="sidecar"))
      + ": must not have container that doesn't exist in the runtime job exporter"]),
    (["patch-no-step-env"], BYO,
     job(BYO, runtimePatches=[patch(job_name="model-initializer",
                                    env=[{"name": "REVISION", "value": "v2"}])]),
     ["spec.runtimePatches: Invalid value: "
      + _patches_json(patch(job_name="model-initializer",
                            env=[{"name": "REVISION", "value": "v2"}]))
      + ": must not have envs for the dataset-initializer, model-initializer, node "
        "containers"]),
    (["env-injection-target"], byo_with_env_injection, job(BYO),
     ['spec.runtimeRef: Invalid value: {"jobName":"node","containerNames":["node",'
      '"sidecar"]}: envInjection target podSet "node" container "sidecar" not found in '
      "runtime template"]),
    (["trainer-reserved-env"], BYO,
     job(BYO, trainer={"env": [{"name": "PET_NNODES", "value": "2"},
                               {"name": "KUBETUNE_EPOCHS", "value": "1"},
                               {"name": "PET_MASTER_ADDR", "value": "x"}]}),
     ['spec.trainer.env: Invalid value: [{"name":"PET_NNODES","value":"2"},{"name":'
      '"KUBETUNE_EPOCHS","value":"1"},{"name":"PET_MASTER_ADDR","value":"x"}]: must not '
      "have reserved envs, invalid envs configured: [PET_MASTER_ADDR PET_NNODES]"]),
    (["tune-supported-model"], BYO, job(BYO, trainer=tune()),
     ['spec.runtimeRef.name: Invalid value: "kubetune-byo-model": must have a supported '
      "pretrained model, invalid model configured: byo/MODEL"]),
    (["tune-single-node"], "torchtune-llama3.2-3b",
     job("torchtune-llama3.2-3b", trainer=tune(numNodes=2)),
     ["spec.trainer.numNodes: Invalid value: 2: must be 1 for llama3_2/3B model"]),
    (["tune-qlora-unsupported"], "torchtune-qwen2.5-1.5b",
     job("torchtune-qwen2.5-1.5b", trainer=tune(args=QLORA, numProcPerNode=1)),
     ['spec.runtimeRef.name: Invalid value: "torchtune-qwen2.5-1.5b": QLoRA is not '
      "supported for qwen2_5/1.5B model"]),
    (["tune-qlora-single-process", "tune-qlora-single-gpu"], "torchtune-llama3.2-1b",
     job("torchtune-llama3.2-1b", trainer=tune(args=QLORA, numProcPerNode=2)),
     ["spec.trainer.numProcPerNode: Invalid value: 2: must be auto or 1 for llama3_2/1B "
      "model when using QLoRA",
      "spec.trainer.resourcesPerNode: Invalid value: null: must have gpu resource with "
      "value 1 for llama3_2/1B model when using QLoRA"]),
    (["tune-no-multinode-lora"], "torchtune-llama3.3-70b",
     job("torchtune-llama3.3-70b", trainer=tune(numNodes=2, args=QLORA[1:])),
     ["spec.trainer.numNodes: Invalid value: 2: LoRA fine-tuning is not supported for "
      "multi-node training in TorchTune"]),
    # QLoRA without lora_attn_modules counts as LoRA too (isUseQLoraFinetune).
    (["tune-no-multinode-lora"], "torchtune-llama3.3-70b",
     job("torchtune-llama3.3-70b", trainer=tune(numNodes=2, args=QLORA[:1])),
     ["spec.trainer.numNodes: Invalid value: 2: LoRA fine-tuning is not supported for "
      "multi-node training in TorchTune"]),
    (["tune-immutable-arg"], "torchtune-llama3.2-1b",
     job("torchtune-llama3.2-1b", trainer=tune(args=["epochs=1",
                                                     "checkpointer.checkpoint_dir=/x"])),
     ['spec.trainer.args[1]: Invalid value: "checkpointer.checkpoint_dir=/x": must not set '
      'immutable config "checkpointer.checkpoint_dir" in trainer args; it is managed by '
      "the runtime"]),
]


def _runtime_of(source) -> dict:
    return runtime(source) if isinstance(source, str) else source()


@pytest.mark.parametrize("ids, source, trainjob, messages", REJECTIONS,
                         ids=[f"{'+'.join(r[0])}-{i}" for i, r in enumerate(REJECTIONS)])
def test_rule_rejects_with_upstreams_message(ids, source, trainjob, messages):
    with pytest.raises(BadInputError) as caught:
        merge(_runtime_of(source), copy.deepcopy(trainjob))
    assert str(caught.value) == "TrainJob rejected: " + "; ".join(messages)
    # The message is the rule's own: its fixed text is in it.
    for rule in (r for r in RULES if r["id"] in ids):
        fixed = (rule.get("message") or rule["detail"] or rule["field"]).split("{")[0]
        assert fixed in str(caught.value)


def test_every_rule_has_a_rejection_case_and_names_its_source():
    covered = {i for ids, *_ in REJECTIONS for i in ids}
    assert covered == {r["id"] for r in RULES}
    # Each upstream rule names its source, "file: function", in v2.3's layout.
    files = {r["upstream"].split(":")[0] for r in RULES if r["plugin"] != "kubetune local"}
    assert files == {"pkg/runtime/framework/plugins/jobset/jobset.go",
                     "pkg/runtime/framework/plugins/torch/torch.go",
                     "pkg/runtime/framework/plugins/torch/torchtune.go"}


def test_several_bad_patches_are_reported_together_with_the_other_errors():
    """No patch stops the check of the next, and patch errors come with the Torch
    plugin's, one line; identical messages once, as the webhook's aggregate prints."""
    patches = [patch(manager="tool"),
               patch(job_name="evaluator"),
               patch(name="sidecar"), patch(manager="example.com/b", name="sidecar"),
               patch(job_name="node", env=[{"name": "X", "value": "1"}])]
    trainjob = job("torchtune-llama3.2-1b", runtimePatches=patches,
                   trainer=tune(numNodes=2))
    with pytest.raises(BadInputError) as caught:
        merge(runtime("torchtune-llama3.2-1b"), trainjob)
    value = _patches_json(*patches)
    assert str(caught.value) == "TrainJob rejected: " + "; ".join([
        'spec.runtimePatches.manager: Invalid value: "tool": must be a domain-prefixed path '
        '(such as "acme.io/foo")',
        f"spec.runtimePatches: Invalid value: {value}: must not have replicated job that "
        "doesn't exist in the runtime job template",
        f"spec.runtimePatches: Invalid value: {value}: must not have container that doesn't "
        "exist in the runtime job exporter",
        f"spec.runtimePatches: Invalid value: {value}: must not have envs for the "
        "dataset-initializer, model-initializer, node containers",
        "spec.trainer.numNodes: Invalid value: 2: must be 1 for llama3_2/1B model"])
    assert "\n" not in str(caught.value)


def _jobset_pod(jobset: dict, name: str) -> dict:
    rjob = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == name)
    return rjob["template"]["spec"]["template"]["spec"]


def test_good_patches_still_merge():
    trainjob = job(BYO, runtimePatches=[
        patch(env=[{"name": "EXPORT_URI", "value": "s3://b/out"}]),
        patch(manager="example.com/sched", job_name="node",
              resources={"limits": {"memory": "80Gi"}})])
    jobset = merge(runtime(BYO), trainjob)
    assert _jobset_pod(jobset, "node")["containers"][0]["resources"]["limits"][
        "memory"] == "80Gi"
    assert {"name": "EXPORT_URI", "value": "s3://b/out"} in \
        _jobset_pod(jobset, "exporter")["containers"][0]["env"]
