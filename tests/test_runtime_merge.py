"""The controller's merge of a TrainJob into a runtime, rule by rule
(kubetune.tools.local.runtime_merge)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubetune.errors import BadInputError
from kubetune.tools.local.runtime_merge import merge, tune_recipe_and_config

BASE = Path(__file__).resolve().parents[1] / "runtimes" / "base"


def runtime(name: str) -> dict:
    return yaml.safe_load((BASE / f"{name}.yaml").read_text())


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
    with pytest.raises(BadInputError, match="env of the node container comes from"):
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
    """The SDK's RuntimePatch option builds the patch README shows for EXPORT_URI."""
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
