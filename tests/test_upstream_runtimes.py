"""Kubeflow Trainer v2.3.0's own runtimes (manifests/base/runtimes/, every one, restated in
tests/support/upstream_runtimes.py) through `kubetune validate` and `kubetune local
--print-jobset`: each is accepted, its JobSet as the controller would make it, or refused
in a line that is true for it (issue 53 §4).

A trainer-only torch runtime (`torch-distributed`: a node container, no volume, no
initializer) has no step handing results over through a workspace, so our workspace
contract does not apply: it validates, and its JobSet carries the torch plugin's PET_*
(numProcPerNode from the TrainJob, else "auto", else the CPUs without a GPU). The plugins
we do not emulate (MPI, JAX, XGBoost) are refused naming the plugin. In-process: the
process boundary is `test_runtime_contract.py`'s; one subprocess shows the CLI's output.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubetune.entrypoints.local import jobset_yaml, merged_jobset
from kubetune.entrypoints.validate import check
from kubetune.tools.local.violations import ContractError
from tests.support.cli import clean_env, kubetune
from tests.support.runtimes import write_trainjob
from tests.support.upstream_runtimes import PYTORCH, upstream_runtimes

ACCEPTED = {
    "torch_distributed.yaml": "node",
    "data-cache/torch_distributed_with_cache.yaml": "dataset-initializer -> node",
    "torchtune/llama3_2/llama3_2_1B.yaml": "dataset-initializer -> model-initializer -> node",
    "torchtune/llama3_2/llama3_2_3B.yaml": "dataset-initializer -> model-initializer -> node",
    "torchtune/qwen2_5/qwen2_5_1.5B.yaml": "dataset-initializer -> model-initializer -> node",
}
REFUSED = {
    "deepspeed_distributed.yaml": "spec.mlPolicy.mpi: the controller's mpi plugin",
    "mlx_distributed.yaml": "spec.mlPolicy.mpi: the controller's mpi plugin",
    "jax_distributed.yaml": "spec.mlPolicy.jax: the controller's jax plugin (JAX_NUM_PROCESSES",
    "xgboost_distributed.yaml": "spec.mlPolicy.xgboost: the controller's xgboost plugin",
}


def _written(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name.replace("/", "_")
    path.write_text(yaml.safe_dump(upstream_runtimes()[name]))
    return path


def test_every_upstream_runtime_is_replayed():
    assert sorted(upstream_runtimes()) == sorted([*ACCEPTED, *REFUSED])
    assert len(upstream_runtimes()) == 9  # v2.3.0's manifests/base/runtimes/


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_runtime_validates_and_prints_its_jobset(tmp_path, capsys, name):
    path = _written(tmp_path, name)
    assert check(path, None) == 0
    assert capsys.readouterr().out == f"ok: {path} ({ACCEPTED[name]})\n"
    jobset = yaml.safe_load(jobset_yaml(merged_jobset(path, None)))
    assert jobset["kind"] == "JobSet"
    assert " -> ".join(j["name"] for j in jobset["spec"]["replicatedJobs"]) == ACCEPTED[name]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_runtime_of_a_plugin_not_emulated_is_refused_naming_it(tmp_path, capsys, name):
    path = _written(tmp_path, name)
    assert check(path, None) == 65
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: validate: {path}: {REFUSED[name]}")
    assert "is not emulated" in lines[0]
    with pytest.raises(ContractError) as err:
        merged_jobset(path, None)
    assert err.value.lines == [lines[0].removeprefix("error: validate: ")]


def _node_env(jobset: dict) -> dict[str, str]:
    node = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]
    assert node["image"] == PYTORCH and "volumeMounts" not in node
    return {v["name"]: v.get("value") for v in node.get("env") or []}


@pytest.mark.parametrize("trainer, nnodes, nproc", [
    ({"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}}, "2", "auto"),
    ({"numProcPerNode": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}}, "1", "2"),
    ({"resourcesPerNode": {"limits": {"cpu": 3}}}, "1", "3"),
], ids=["gpus-auto", "numProcPerNode", "cpus"])
def test_torch_distributed_gets_the_torch_plugins_env(tmp_path, trainer, nnodes, nproc):
    """PET_* as upstream's torch plugin sets them: numProcPerNode from the TrainJob, else
    "auto" with GPUs, else the CPUs of resourcesPerNode."""
    path = _written(tmp_path, "torch_distributed.yaml")
    job = write_trainjob(tmp_path / "job.yaml", "torch-distributed",
                         {"trainer": {"command": ["torchrun", "train.py"], **trainer}},
                         name="demo")
    env = _node_env(merged_jobset(path, job))
    assert env["PET_NNODES"] == nnodes and env["PET_NPROC_PER_NODE"] == nproc
    assert env["PET_MASTER_ADDR"] == "demo-node-0-0.demo" and env["PET_MASTER_PORT"] == "29500"


def test_torch_distributed_through_the_cli(tmp_path):
    path = _written(tmp_path, "torch_distributed.yaml")
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime", str(path),
                      "--print-jobset", env=clean_env())
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["spec"]["replicatedJobs"][0]["name"] == "node"
    assert not (tmp_path / "run").exists()


def test_a_runtime_that_hands_over_still_needs_the_workspace(tmp_path, capsys):
    """The contract stays where a step hands over: upstream's torchtune runtime with the
    trainer's mount removed is refused, as before."""
    runtime = upstream_runtimes()["torchtune/llama3_2/llama3_2_1B.yaml"]
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][2]["template"]["spec"][
        "template"]["spec"]["containers"][0]
    del node["volumeMounts"]
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(runtime))
    assert check(path, None) == 65
    assert "containers[node].volumeMounts: nothing mounted at /workspace" in \
        capsys.readouterr().err


def test_torch_distributed_runs_here_with_the_controllers_env(tmp_path):
    """Emulated as the controller would run it: the node container's command (the
    TrainJob's) as a process, with PET_* as the torch plugin sets them; no workspace."""
    path = _written(tmp_path, "torch_distributed.yaml")
    show = "import os; print('nnodes', os.environ['PET_NNODES'], 'nproc', " \
           "os.environ['PET_NPROC_PER_NODE'])"
    job = write_trainjob(tmp_path / "job.yaml", "torch-distributed", {"trainer": {
        "command": ["python", "-c", show], "resourcesPerNode": {"limits": {"cpu": 2}}}})
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime", str(path),
                      "--trainjob", str(job), env=clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[node] nnodes 1 nproc 2" in result.stdout
    assert f"logs: {tmp_path / 'run' / 'logs'}" in result.stdout
    assert not (tmp_path / "run" / "workspace").exists()
