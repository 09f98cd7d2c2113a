"""The controller's merge of a TrainJob into a runtime, rule by rule
(kubetune.tools.local.runtime_merge)."""

from __future__ import annotations


import pytest
import yaml

from kubetune.errors import BadInputError
from kubetune.tools.local.runtime_merge import merge, tune_recipe_and_config
from tests.support.runtimes import runtime_file



def runtime(name: str) -> dict:
    return yaml.safe_load(runtime_file(name).read_text())


def job(runtime_name: str, **spec) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "j"}, "spec": {"runtimeRef": {"name": runtime_name}, **spec}}


def container(jobset: dict, job_name: str) -> dict:
    rjob = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == job_name)
    return rjob["template"]["spec"]["template"]["spec"]["containers"][0]


def env(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


@pytest.mark.parametrize("nodes, nproc, gpus, args, expected", [
    (1, "auto", 2, [], ("full_finetune_distributed", "llama3_2/1B_full")),
    (1, 1, 2, [], ("full_finetune_single_device", "llama3_2/1B_full_single_device")),
    (1, "auto", 1, ["model.lora_attn_modules=[q_proj]"],
     ("lora_finetune_single_device", "llama3_2/1B_lora_single_device")),
    (1, "auto", 1, ["model.quantize_base=True"],
     ("lora_finetune_single_device", "llama3_2/1B_qlora_single_device")),
    (1, "auto", 4, ["model.lora_attn_modules=[q_proj]"],
     ("lora_finetune_distributed", "llama3_2/1B_lora")),
    (1, "auto", 4, ["model.quantize_base=True", "model.use_dora=True"],
     ("full_finetune_distributed", "llama3_2/1B_full")),
])
def test_recipe_choice_matches_the_controller(nodes, nproc, gpus, args, expected):
    assert tune_recipe_and_config(nodes, nproc, gpus, args, "torchtune-llama3.2-1b") == expected


def test_direct_runtime_gets_master_env_and_trainjob_overrides():
    jobset = merge(runtime("kubetune-byo-model"), job(
        "kubetune-byo-model",
        initializer={"model": {"storageUri": "s3://b/m", "env": [{"name": "REVISION",
                                                                   "value": "v2"}]}},
        trainer={"numNodes": 2, "image": "my/trainer:1", "args": ["epochs=2"],
                 "env": [{"name": "KUBETUNE_METHOD", "value": "dora"}],
                 "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}}))
    node = container(jobset, "node")
    assert node["image"] == "my/trainer:1" and node["args"] == ["epochs=2"]
    assert node["command"] == ["kubetune", "train"]  # not `tune run`: kept as the runtime says
    assert node["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert node["resources"]["limits"]["memory"] == "64Gi"  # merged, not replaced
    e = env(node)
    assert e["KUBETUNE_METHOD"] == "dora"
    assert (e["PET_NNODES"], e["PET_NPROC_PER_NODE"]) == ("2", "auto")
    assert (e["PET_MASTER_ADDR"], e["PET_MASTER_PORT"]) == ("j-node-0-0.j", "29500")
    assert env(container(jobset, "model-initializer")) == {"STORAGE_URI": "s3://b/m",
                                                           "REVISION": "v2"}
    node_job = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == "node")
    assert node_job["template"]["spec"]["parallelism"] == 2


def test_runtime_patch_reaches_the_exporter_but_not_the_trainer_env():
    patch = {"manager": "example.com/tool", "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": "exporter", "template": {"spec": {"template": {"spec": {
            "containers": [{"name": "exporter", "env": [
                {"name": "EXPORT_URI", "value": "s3://b/out"}]}]}}}}}]}}}}
    jobset = merge(runtime("kubetune-byo-model"), job("kubetune-byo-model",
                                                      runtimePatches=[patch]))
    assert env(container(jobset, "exporter"))["EXPORT_URI"] == "s3://b/out"
    patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0].update(name="node")
    patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]["containers"][0]["name"] = "node"
    with pytest.raises(BadInputError, match="spec.runtimePatches: Invalid value: .*: must not "
                       "have envs for the dataset-initializer, model-initializer, node "
                       "containers$"):
        merge(runtime("kubetune-byo-model"), job("kubetune-byo-model", runtimePatches=[patch]))


def test_gang_runtime_labels_every_pod_with_the_pod_group():
    jobset = merge(runtime("kubetune-llama3.1-8b-full-multinode"),
                   job("kubetune-llama3.1-8b-full-multinode", trainer={"numNodes": 3}))
    for rjob in jobset["spec"]["replicatedJobs"]:
        labels = rjob["template"]["spec"]["template"]["metadata"]["labels"]
        assert labels["scheduling.x-k8s.io/pod-group"] == "j"
    assert env(container(jobset, "node"))["PET_NNODES"] == "3"


@pytest.mark.filterwarnings("ignore:Support for class-based `config`")
def test_sdk_runtime_patch_option_sets_the_export_destination():
    """The SDK's RuntimePatch option builds the patch docs/runtimes.md shows for EXPORT_URI."""
    from kubeflow.trainer.options.kubernetes import (ContainerPatch, JobSetSpecPatch,
                                                     JobSetTemplatePatch, JobSpecPatch,
                                                     JobTemplatePatch, PodSpecPatch,
                                                     PodTemplatePatch, ReplicatedJobPatch,
                                                     RuntimePatch, TrainingRuntimeSpecPatch,
                                                     _patch_to_dict)

    option = RuntimePatch(training_runtime_spec=TrainingRuntimeSpecPatch(
        template=JobSetTemplatePatch(spec=JobSetSpecPatch(replicated_jobs=[ReplicatedJobPatch(
            name="exporter", template=JobTemplatePatch(spec=JobSpecPatch(
                template=PodTemplatePatch(spec=PodSpecPatch(containers=[ContainerPatch(
                    name="exporter", env=[{"name": "EXPORT_URI",
                                           "value": "s3://b/out"}])])))))]))))
    # What the option adds to the TrainJob spec (RuntimePatch.__call__ needs a cluster).
    jobset = merge(runtime("kubetune-llama3.1-8b-lora"),
                   job("kubetune-llama3.1-8b-lora", runtimePatches=[_patch_to_dict(option)]))
    assert env(container(jobset, "exporter"))["EXPORT_URI"] == "s3://b/out"


# -- where `kubetune local` used to differ from the controller (issue 23, part 3) --------

def _node_env(jobset: dict) -> dict:
    return env(container(jobset, "node"))


@pytest.mark.parametrize("resources, nproc", [
    ({"limits": {"cpu": "2.5"}}, "3"),           # a fraction rounds up, as Quantity.Value()
    ({"limits": {"cpu": "2500m"}}, "3"),
    ({"limits": {"cpu": "500m"}}, "1"),
    ({"limits": {"cpu": "4"}}, "4"),
    ({"requests": {"cpu": "1.2"}}, "2"),
    # The request first, the limit only where no (or a zero) request is set: v2.3's
    # getNumCPUPerNode.
    ({"limits": {"cpu": "3"}, "requests": {"cpu": "1"}}, "1"),
    ({"limits": {"cpu": "3"}, "requests": {"cpu": "0"}}, "3"),
    ({"limits": {"nvidia.com/gpu": 2, "cpu": "3"}}, "auto"),    # a GPU: torchrun's auto
])
def test_nproc_auto_on_cpu_counts_like_the_controller(resources, nproc):
    jobset = merge(runtime("kubetune-byo-model"),
                   job("kubetune-byo-model", trainer={"resourcesPerNode": resources}))
    assert _node_env(jobset)["PET_NPROC_PER_NODE"] == nproc


def test_no_trainer_in_the_trainjob_injects_no_torch_env():
    jobset = merge(runtime("kubetune-byo-model"), job("kubetune-byo-model"))
    node = container(jobset, "node")
    assert not [n for n in env(node) if n.startswith("PET_")]
    assert "ports" not in node
    assert env(node)["KUBETUNE_METHOD"] == "lora"  # the runtime's own env stays


def test_an_empty_trainer_still_gets_the_torch_env():
    # `trainer: {}` is set (the controller sees a non-nil spec.trainer), unlike no trainer:
    # PET_*, the master address and the port, from the runtime's own node count and GPUs.
    jobset = merge(runtime("kubetune-byo-model"), job("kubetune-byo-model", trainer={}))
    node = container(jobset, "node")
    e = env(node)
    assert (e["PET_NNODES"], e["PET_NPROC_PER_NODE"]) == ("1", "auto")  # the runtime's GPU
    assert (e["PET_MASTER_ADDR"], e["PET_MASTER_PORT"]) == ("j-node-0-0.j", "29500")
    assert {"containerPort": 29500} in node["ports"]


QLORA = ["model.quantize_base=True", "model.lora_attn_modules=[q_proj,v_proj]"]


@pytest.mark.parametrize("name, trainer, errors", [
    # Multi-device QLoRA on 1B/3B: upstream's two errors, both.
    ("torchtune-llama3.2-1b", {"args": QLORA},
     ['spec.trainer.numProcPerNode: Invalid value: "auto": must be auto or 1 for '
      'llama3_2/1B model when using QLoRA',
      "spec.trainer.resourcesPerNode: Invalid value: null: must have gpu resource with "
      "value 1 for llama3_2/1B model when using QLoRA"]),
    ("torchtune-llama3.2-3b", {"args": QLORA, "resourcesPerNode": {
        "limits": {"nvidia.com/gpu": 4}}},
     ['spec.trainer.numProcPerNode: Invalid value: "auto": must be auto or 1 for '
      'llama3_2/3B model when using QLoRA',
      'spec.trainer.resourcesPerNode: Invalid value: {"limits":{"nvidia.com/gpu":"4"}}: '
      "must have gpu resource with value 1 for llama3_2/3B model when using QLoRA"]),
    ("torchtune-qwen2.5-1.5b", {"args": QLORA},
     ['spec.runtimeRef.name: Invalid value: "torchtune-qwen2.5-1.5b": QLoRA is not '
      "supported for qwen2_5/1.5B model"]),
    # Every error at once, not the first.
    ("torchtune-llama3.2-1b", {"numNodes": 2, "args": [
        "model.lora_attn_modules=[q_proj]", "output_dir=/x", "tokenizer.path=/y"]},
     ["spec.trainer.numNodes: Invalid value: 2: must be 1 for llama3_2/1B model",
      "spec.trainer.numNodes: Invalid value: 2: LoRA fine-tuning is not supported for "
      "multi-node training in TorchTune",
      'spec.trainer.args[1]: Invalid value: "output_dir=/x": must not set immutable config '
      '"output_dir" in trainer args; it is managed by the runtime',
      'spec.trainer.args[2]: Invalid value: "tokenizer.path=/y": must not set immutable '
      'config "tokenizer.path" in trainer args; it is managed by the runtime']),
])
def test_tune_admission_reports_every_error(name, trainer, errors):
    """Upstream's field errors (kubeflow/trainer v2.3 validateTorchTune), word for word,
    all of them and nothing else, on one line."""
    with pytest.raises(BadInputError) as caught:
        merge(runtime(name), job(name, trainer={"command": ["tune", "run"], **trainer}))
    assert str(caught.value) == "TrainJob rejected: " + "; ".join(errors)


@pytest.mark.parametrize("name, trainer", [
    # Single-device QLoRA on 1B is admitted (one GPU, or one process).
    ("torchtune-llama3.2-1b", {"args": QLORA, "resourcesPerNode": {
        "limits": {"nvidia.com/gpu": 1}}}),
    ("torchtune-llama3.2-1b", {"args": QLORA, "numProcPerNode": 1}),
    # DoRA with quantize_base is not QLoRA, so multi-device is fine.
    ("torchtune-llama3.2-1b", {"args": [*QLORA, "model.use_dora=True"]}),
])
def test_tune_admission_admits(name, trainer):
    merge(runtime(name), job(name, trainer={"command": ["tune", "run"], **trainer}))


def test_tune_run_is_held_to_torchrun_reserved_env_too():
    # Upstream's Torch.Validate checks the reserved PET_* names before it looks at the
    # command, so a `tune run` TrainJob may not set them either.
    with pytest.raises(BadInputError) as caught:
        merge(runtime("torchtune-llama3.2-1b"), job("torchtune-llama3.2-1b", trainer={
            "command": ["tune", "run"], "env": [{"name": "PET_MASTER_PORT", "value": "1234"}]}))
    assert str(caught.value) == (
        'TrainJob rejected: spec.trainer.env: Invalid value: [{"name":"PET_MASTER_PORT",'
        '"value":"1234"}]: must not have reserved envs, invalid envs configured: '
        "[PET_MASTER_PORT]")


def test_dora_with_quantize_base_says_qlora_is_dropped(caplog):
    args = ["model.use_dora=True", "model.quantize_base=True",
            "model.lora_attn_modules=[q_proj]"]
    with caplog.at_level("WARNING", logger="kubetune.local"):
        jobset = merge(runtime("torchtune-llama3.2-1b"), job(
            "torchtune-llama3.2-1b", trainer={"command": ["tune", "run"], "args": args}))
    assert "llama3_2/1B_lora" in container(jobset, "node")["command"]
    assert any("without QLoRA" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="kubetune.local"):
        merge(runtime("torchtune-llama3.2-1b"), job("torchtune-llama3.2-1b", trainer={
            "command": ["tune", "run"], "args": args[1:], "numProcPerNode": 1}))
    assert not caplog.records
