"""Kubeflow Trainer v2.3.0's own ClusterTrainingRuntimes (kubeflow/trainer at tag v2.3.0,
every file under manifests/base/runtimes/), restated in our words: what `kubetune
validate` and `kubetune local --print-jobset` read of each (its name, mlPolicy, and per
replicatedJob the ancestor label, dependsOn and containers: name, image, command, volume
mounts, env names), not upstream's files. The count is asserted by the replay, so a
runtime cannot drop out unnoticed; the images are upstream's, named as upstream does."""

from __future__ import annotations

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
PYTORCH = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
TORCHTUNE_IMAGE = "ghcr.io/kubeflow/trainer/torchtune-trainer"
WORKSPACE_CLAIM = "initializer"


def _job(name: str, containers: list[dict], ancestor: str | None = None,
         depends_on: tuple[str, ...] = (), status: str = "Complete") -> dict:
    template: dict = {"spec": {"template": {"spec": {"containers": containers}}}}
    if ancestor:
        template["metadata"] = {"labels": {ANCESTOR: ancestor}}
    job: dict = {"name": name, "template": template}
    if depends_on:
        job["dependsOn"] = [{"name": d, "status": status} for d in depends_on]
    return job


def _runtime(name: str, ml_policy: dict, jobs: list[dict], claim: bool = False) -> dict:
    spec: dict = {"replicatedJobs": jobs}
    if claim:
        spec["volumeClaimPolicies"] = [{"templates": [{
            "metadata": {"name": WORKSPACE_CLAIM},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "20Gi"}}}}]}]
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name}, "spec": {"mlPolicy": ml_policy,
                                                 "template": {"spec": spec}}}


def _mpi_runtime(name: str, image: str) -> dict:
    """deepspeed-distributed and mlx-distributed: an MPI launcher (the trainer) after
    sshd nodes."""
    policy = {"numNodes": 1, "mpi": {"numProcPerNode": 1, "mpiImplementation": "OpenMPI",
                                     "sshAuthMountPath": "/home/mpiuser/.ssh",
                                     "runLauncherAsNode": True}}
    sshd = {"name": "node", "image": image, "command": ["/usr/sbin/sshd"],
            "args": ["-De", "-f", "/home/mpiuser/.sshd_config"]}
    return _runtime(name, policy, [
        _job("node", [sshd]),
        _job("launcher", [{"name": "node", "image": image}], "trainer", ("node",), "Ready")])


def _torchtune_runtime(name: str, model: str, dataset: str, config: str, gpus: int) -> dict:
    """The torchtune-* runtimes: both initializers into the claim, then `tune run`."""
    mount = [{"name": WORKSPACE_CLAIM, "mountPath": "/workspace"}]

    def initializer(step: str, uri: str) -> dict:
        return _job(step, [{"name": step, "image": f"ghcr.io/kubeflow/trainer/{step}",
                            "env": [{"name": "STORAGE_URI", "value": uri}],
                            "volumeMounts": mount}], step)

    node = {"name": "node", "image": TORCHTUNE_IMAGE, "command": [
        "tune", "run", "--rdzv_endpoint=localhost:29500", "full_finetune_distributed",
        "--config", config, "dataset=torchtune.datasets.instruct_dataset",
        "dataset.source=parquet", "dataset.data_dir=/workspace/dataset/data",
        "output_dir=/workspace/output",
        "tokenizer.path=/workspace/model/original/tokenizer.model",
        "checkpointer.checkpoint_dir=/workspace/model"],
        "resources": {"limits": {"nvidia.com/gpu": gpus}}, "volumeMounts": mount}
    return _runtime(name, {"numNodes": 1, "torch": {}}, [
        initializer("dataset-initializer", dataset), initializer("model-initializer", model),
        _job("node", [node], "trainer", ("dataset-initializer", "model-initializer"))],
        claim=True)


def upstream_runtimes() -> dict[str, dict]:
    """File under manifests/base/runtimes/ -> the runtime it defines."""
    cache_env = [{"name": "TRAIN_JOB_NAME", "valueFrom": {"fieldRef": {
        "apiVersion": "v1",
        "fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}}]
    return {
        "torch_distributed.yaml": _runtime(
            "torch-distributed", {"numNodes": 1, "torch": {}},
            [_job("node", [{"name": "node", "image": PYTORCH}], "trainer")]),
        "data-cache/torch_distributed_with_cache.yaml": _runtime(
            "torch-distributed-with-cache", {"numNodes": 1, "torch": {}}, [
                _job("dataset-initializer", [{
                    "name": "dataset-initializer",
                    "image": "ghcr.io/kubeflow/trainer/dataset-initializer",
                    "env": [{"name": "CACHE_IMAGE",
                             "value": "ghcr.io/kubeflow/trainer/data-cache:v2.3.0"},
                            *cache_env]}], "dataset-initializer"),
                _job("node", [{"name": "node", "image": PYTORCH, "env": cache_env}],
                     "trainer", ("dataset-initializer",))]),
        "deepspeed_distributed.yaml": _mpi_runtime(
            "deepspeed-distributed", "ghcr.io/kubeflow/trainer/deepspeed-runtime"),
        "mlx_distributed.yaml": _mpi_runtime(
            "mlx-distributed", "ghcr.io/kubeflow/trainer/mlx-runtime"),
        "jax_distributed.yaml": _runtime(
            "jax-distributed", {"numNodes": 1, "jax": {}},
            [_job("node", [{"name": "node", "image": "nvcr.io/nvidia/jax:25.10-py3"}],
                  "trainer")]),
        "xgboost_distributed.yaml": _runtime(
            "xgboost-distributed", {"numNodes": 1, "xgboost": {}},
            [_job("node", [{"name": "node",
                            "image": "ghcr.io/kubeflow/trainer/xgboost-runtime"}], "trainer")]),
        "torchtune/llama3_2/llama3_2_1B.yaml": _torchtune_runtime(
            "torchtune-llama3.2-1b", "hf://meta-llama/Llama-3.2-1B-Instruct",
            "hf://tatsu-lab/alpaca", "llama3_2/1B_full", 2),
        "torchtune/llama3_2/llama3_2_3B.yaml": _torchtune_runtime(
            "torchtune-llama3.2-3b", "hf://meta-llama/Llama-3.2-3B-Instruct",
            "hf://tatsu-lab/alpaca", "llama3_2/3B_full", 2),
        "torchtune/qwen2_5/qwen2_5_1.5B.yaml": _torchtune_runtime(
            "torchtune-qwen2.5-1.5b", "hf://Qwen/Qwen2.5-1.5B-Instruct",
            "hf://tatsu-lab/alpaca", "qwen2_5/1.5B_full", 2),
    }
