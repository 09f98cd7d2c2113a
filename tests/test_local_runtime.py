"""`kubetune local --runtime`: a ClusterTrainingRuntime, merged with a TrainJob as the
controller merges them, run here end to end on the tiny model; and its failure policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.runtimes import runtime_file, write_trainjob
from tests.support.sdk_trainjob import sdk_trainjob_spec

# The SDK 0.5.0's own pydantic models warn on import; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")



def trainjob(tmp_path: Path, runtime: str, spec: dict, name: str = "tiny") -> Path:
    return write_trainjob(tmp_path / f"{name}.yaml", runtime, spec, name)


def sources(model: Path, dataset: Path) -> dict:
    return {"initializer": {"model": {"storageUri": f"file://{model}"},
                            "dataset": {"storageUri": f"file://{dataset}"}}}


def run(tmp_path: Path, runtime: str, job: Path | None = None):
    args = ["local", "--workdir", str(tmp_path / "run"), "--runtime", str(runtime_file(runtime))]
    return kubetune(*args, *(["--trainjob", str(job)] if job else []), env=clean_env())


@pytest.mark.slow
def test_dropin_runtime_runs_the_sdk_builtin_trainer_job(tmp_path, tiny_model_dir,
                                                         tiny_dataset_dir):
    """What the SDK's BuiltinTrainer submits: `tune run` + LoRA args. The controller's
    composition picks the LoRA single-device recipe; the exporter publishes the adapter."""
    spec = sdk_trainjob_spec(runtime_file("torchtune-llama3.2-1b"))
    assert spec["trainer"]["command"] == ["tune", "run"]
    spec["initializer"]["model"]["storageUri"] = f"file://{tiny_model_dir}"
    spec["initializer"]["dataset"]["storageUri"] = f"file://{tiny_dataset_dir}"
    job = trainjob(tmp_path, "torchtune-llama3.2-1b", spec)
    result = run(tmp_path, "torchtune-llama3.2-1b.yaml", job)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    ws = tmp_path / "run" / "workspace"
    summary = json.loads((ws / "output" / "summary.json").read_text())
    merged = yaml.safe_load((ws / "output" / "kubetune-config.yaml").read_text())
    # One epoch of 512 rows at the SDK's batch size, the recipe's gradient accumulation.
    assert merged["batch_size"] == 16 and merged["epochs"] == 1
    assert summary["steps"] == 512 // (16 * merged["gradient_accumulation_steps"])
    assert merged["model"]["lora_rank"] == 8 and merged["output_dir"] == str(ws / "output")
    assert "lora_finetune_single_device" in result.stdout  # the controller's recipe choice
    assert (ws / "export" / "adapter_model.safetensors").is_file()
    assert (ws / "export" / "manifest.json").is_file()
    order = [line.split(":")[0] for line in result.stdout.splitlines()
             if line.startswith("==> ") and line.endswith("s")]
    assert order.index("==> node") > max(order.index("==> model-initializer"),
                                          order.index("==> dataset-initializer"))
    assert order[-1] == "==> exporter"


@pytest.mark.slow
def test_direct_byo_model_runtime_with_export_uri_from_a_runtime_patch(
        tmp_path, tiny_model_dir, tiny_dataset_dir):
    job = trainjob(tmp_path, "kubetune-byo-model", {
        **sources(tiny_model_dir, tiny_dataset_dir),
        "trainer": {"env": [{"name": "KUBETUNE_MAX_STEPS", "value": "3"},
                            {"name": "KUBETUNE_EPOCHS", "value": "1"},
                            {"name": "KUBETUNE_BATCH_SIZE", "value": "8"}]},
        "runtimePatches": [{"manager": "kubetune.io/test", "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [{"name": "exporter", "template": {
                "spec": {"template": {"spec": {"containers": [{"name": "exporter", "env": [
                    {"name": "EXPORT_URI", "value": "/workspace/published"}]}]}}}}}]}}}}]})
    result = run(tmp_path, "kubetune-byo-model.yaml", job)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    ws = tmp_path / "run" / "workspace"
    assert json.loads((ws / "output" / "summary.json").read_text())["steps"] == 3
    manifest = json.loads((ws / "published" / "manifest.json").read_text())
    assert any(f["path"].endswith("adapter_model.safetensors") for f in manifest["files"])
    assert not (ws / "export").exists()


@pytest.mark.slow
def test_multinode_full_finetune_runtime_on_two_nodes(tmp_path, tiny_model_dir,
                                                      tiny_dataset_dir):
    # The gang-scheduled runtime is one stage: every node stages the sources on its own
    # disk (/local, a per-pod volume here), the nodes rendezvous and train together, and
    # node 0 exports to the shared claim.
    job = trainjob(tmp_path, "kubetune-llama3.1-8b-full-multinode", {"trainer": {
        "numNodes": 2, "numProcPerNode": 1,
        "resourcesPerNode": {"limits": {"cpu": "1", "memory": "4Gi"}},
        "env": [{"name": "MODEL_URI", "value": f"file://{tiny_model_dir}"},
                {"name": "DATASET_URI", "value": f"file://{tiny_dataset_dir}"}],
        "args": ["epochs=1", "max_steps_per_epoch=3", "batch_size=4",
                 "dataset=torchtune.datasets.instruct_dataset", "dataset.split=train"]}})
    result = run(tmp_path, "kubetune-llama3.1-8b-full-multinode.yaml", job)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    for node in ("node-0", "node-1"):
        assert f"==> {node}: ok" in result.stdout
    ws = tmp_path / "run" / "workspace"
    summary = json.loads((ws / "output" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 3
    manifest = json.loads((ws / "export" / "manifest.json").read_text())
    assert manifest["format"] == "merged"
    assert any(f["path"].endswith(".safetensors") for f in manifest["files"])


@pytest.mark.parametrize("runtime, trainer", [
    ("kubetune-byo-model", {"numNodes": 2, "numProcPerNode": 1}),
    ("torchtune-llama3.3-70b", {"command": ["tune", "run"], "numNodes": 2}),
])
def test_each_run_here_rendezvous_on_a_port_of_its_own(tmp_path, runtime, trainer):
    """On a cluster every pod has an address of its own; here every pod is 127.0.0.1, so
    two runs at once (two users, two CI jobs) would meet on the runtime's 29500: each run
    gets a free loopback port, in PET_MASTER_PORT and in `tune run`'s --rdzv_endpoint."""
    from kubetune.tools.local.jobset import LocalJobSet
    from kubetune.tools.local.runtime_merge import TRAINER_PORT, merge
    from kubetune.tools.local.runtime_spec import default_trainjob, load_runtime

    spec = load_runtime(runtime_file(runtime))
    job = default_trainjob(spec)
    job["spec"]["trainer"] = trainer
    endpoints = []
    for run in ("first", "second"):
        jobset = LocalJobSet(merge(spec, job), tmp_path / run)
        node = next(j for j in jobset.spec["replicatedJobs"] if j["name"] == "node")
        container = node["template"]["spec"]["template"]["spec"]["containers"][0]
        steps = [jobset.step(node, container, index, 2) for index in (0, 1)]
        seen = set()
        for step in steps:
            rdzv = [a.split("=", 1)[1] for a in step.command if a.startswith("--rdzv_endpoint=")]
            if rdzv:
                seen |= set(rdzv)
            else:
                seen.add(f"{step.env['PET_MASTER_ADDR']}:{step.env['PET_MASTER_PORT']}")
        assert len(seen) == 1, seen  # both nodes meet at one endpoint
        endpoints.append(seen.pop())
    assert all(e.startswith("127.0.0.1:") for e in endpoints), endpoints
    assert endpoints[0] != endpoints[1] and f"127.0.0.1:{TRAINER_PORT}" not in endpoints


def policy_runtime(tmp_path: Path, node_exit: int) -> Path:
    """The BYO-model runtime with steps that only exit: the node fails once with
    ``node_exit``, then succeeds (a marker on the PVC remembers the first attempt)."""
    runtime = yaml.safe_load(runtime_file("kubetune-byo-model").read_text())
    script = ("import os, pathlib, sys; p = pathlib.Path(os.environ['KUBETUNE_WORKSPACE'], "
              "'attempts'); n = len(p.read_text()) if p.exists() else 0; "
              f"p.write_text('x' * (n + 1)); sys.exit({node_exit} if n == 0 else 0)")
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        container = job["template"]["spec"]["template"]["spec"]["containers"][0]
        container.pop("env", None)
        container["command"] = [sys.executable, "-c", script if job["name"] == "node" else
                                "print('step ran')"]
    path = tmp_path / "policy-runtime.yaml"
    path.write_text(yaml.safe_dump(runtime))
    return path


def test_transient_exit_restarts_the_jobset(tmp_path):
    runtime = policy_runtime(tmp_path, 75)
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime", str(runtime),
                      env=clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "exit 75 -> podFailurePolicy Count" in result.stdout
    assert "(BackoffLimitExceeded): failurePolicy RestartJobSet -> restarting" in result.stdout
    assert (tmp_path / "run" / "workspace" / "attempts").read_text() == "xx"
    assert result.stdout.count("[exporter] step ran") == 1
    assert "restarts: 1" in result.stdout


def test_bad_input_exit_fails_without_restart(tmp_path):
    runtime = policy_runtime(tmp_path, 65)
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime", str(runtime),
                      env=clean_env())
    assert result.returncode == 65
    assert "(PodFailurePolicy): failurePolicy FailJobSet -> JobSet failed" in result.stdout
    assert (tmp_path / "run" / "workspace" / "attempts").read_text() == "x"
    assert "[exporter]" not in result.stdout
    assert len(error_lines(result)) == 1


def test_byo_model_without_sources_fails_at_once(tmp_path):
    job = trainjob(tmp_path, "kubetune-byo-model", {})
    result = run(tmp_path, "kubetune-byo-model.yaml", job)
    assert result.returncode == 2  # usage: STORAGE_URI missing; no restart
    assert "restarting" not in result.stdout
    assert "--storage-uri" in result.stdout + result.stderr


@pytest.mark.parametrize("spec, message", [
    ({"trainer": {"command": ["tune", "run"], "args": ["output_dir=/elsewhere"]}},
     'spec.trainer.args[0]: Invalid value: "output_dir=/elsewhere": must not set immutable '
     'config "output_dir" in trainer args; it is managed by the runtime'),
    ({"trainer": {"env": [{"name": "PET_NNODES", "value": "4"}]}},
     "spec.trainer.env: Invalid value: [{\"name\":\"PET_NNODES\",\"value\":\"4\"}]: must "
     "not have reserved envs, invalid envs configured: [PET_NNODES]"),
    ({"trainer": {"command": ["tune", "run"], "numNodes": 2}},
     "spec.trainer.numNodes: Invalid value: 2: must be 1 for llama3_2/1B model"),
])
def test_admission_errors_are_one_line(tmp_path, spec, message):
    job = trainjob(tmp_path, "torchtune-llama3.2-1b", spec)
    result = run(tmp_path, "torchtune-llama3.2-1b.yaml", job)
    assert result.returncode == 65
    assert len(error_lines(result)) == 1 and message in error_lines(result)[0]
    assert not (tmp_path / "run" / "workspace").exists()


def test_trainjob_for_another_runtime_is_refused(tmp_path):
    job = trainjob(tmp_path, "torchtune-llama3.2-3b", {})
    result = run(tmp_path, "torchtune-llama3.2-1b.yaml", job)
    assert result.returncode == 65
    assert "runtimeRef.name is 'torchtune-llama3.2-3b' but the runtime is " \
           "'torchtune-llama3.2-1b'" in error_lines(result)[0]


def test_unreadable_runtime_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ClusterTrainingRuntime\n  spec: [\n")
    result = kubetune("local", "--workdir", str(tmp_path), "--runtime", str(bad),
                      env=clean_env())
    assert result.returncode == 65
    assert error_lines(result) == [f"error: local: {bad}: not valid YAML (line 2)"]


@pytest.mark.parametrize("args, message", [
    (["--trainjob", "job.yaml"], "--trainjob and --print-jobset need --runtime"),
    (["--runtime", str(runtime_file("kubetune-byo-model")), "--model", "file:///m"],
     "with --runtime, set sources and trainer args in the TrainJob"),
])
def test_option_mixups_are_one_line(tmp_path, args, message):
    result = kubetune("local", "--workdir", str(tmp_path), *args, env=clean_env())
    assert result.returncode == 65
    assert len(error_lines(result)) == 1 and message in error_lines(result)[0]


# The console script pip writes for torchtune's `tune` (and for our `kubetune`) beside the
# interpreter, as in the all-in-one image's Python environment.
CONSOLE_SCRIPT = """#!{python}
import sys
from {module} import {func}
if __name__ == "__main__":
    sys.exit({func}())
"""


def image_like_python(root: Path) -> Path:
    """An interpreter laid out as in the all-in-one image: its bin dir holds torchtune's own
    `tune` (and `kubetune`); our `tune`, written by `kubetune install-tune`, lives in
    /opt/kubetune/bin. It imports this checkout's packages (no install: seconds, not minutes)."""
    import site
    import venv

    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                   "print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # addsitedir: the editable install's own .pth (our import root) is honoured too.
    (purelib / "checkout.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages()))
    for name, module, func in (("tune", "torchtune._cli.tune", "main"),
                               ("kubetune", "kubetune.entrypoints.cli", "main")):
        (env_dir / "bin" / name).write_text(CONSOLE_SCRIPT.format(
            python=python, module=module, func=func))
        (env_dir / "bin" / name).chmod(0o755)
    subprocess.run([str(env_dir / "bin" / "kubetune"), "install-tune", "--bin-dir",
                    str(root / "opt" / "kubetune" / "bin")], check=True, capture_output=True)
    return python


def test_dropin_runtime_runs_our_tune_not_the_one_beside_the_interpreter(
        tmp_path, tiny_model_dir, tiny_dataset_dir):
    """The image puts /opt/kubetune/bin first on PATH; the interpreter's bin dir (where pip
    put torchtune's `tune`) comes later. `kubetune local` keeps that order: the runtime's
    `tune run` reaches our launcher, whose dry run prints its plan."""
    python = image_like_python(tmp_path / "image")
    job = trainjob(tmp_path, "torchtune-llama3.2-1b", {
        **sources(tiny_model_dir, tiny_dataset_dir),
        "trainer": {"command": ["tune", "run"], "args": [
            "dataset=torchtune.datasets.instruct_dataset", "dataset.split=train",
            "--kubetune-dry-run"]}})
    path = os.pathsep.join([str(tmp_path / "image" / "opt" / "kubetune" / "bin"),
                            str(python.parent), os.environ["PATH"]])
    result = subprocess.run(
        [str(python.parent / "kubetune"), "local", "--workdir", str(tmp_path / "run"),
         "--runtime", str(runtime_file("torchtune-llama3.2-1b")), "--trainjob", str(job)],
        env=clean_env(PATH=path), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    node = [line for line in result.stdout.splitlines() if line.startswith("[node")]
    assert "==> node: ok" in result.stdout, result.stdout[-3000:] + result.stderr
    # Our launcher's dry run: the plan, no training.
    assert any(line.startswith("[node] recipe: full_finetune_") for line in node), node
    assert any(line.startswith("[node] method: full;") for line in node), node


def test_gang_runtime_without_spec_trainer_fails_at_once(tmp_path):
    """No spec.trainer: the controller sets no PET_*, so the gang script must not run
    every node as if alone; one error line, exit 65, nothing fetched."""
    result = run(tmp_path, "kubetune-llama3.1-8b-full-multinode.yaml")
    assert result.returncode == 65, result.stdout[-2000:] + result.stderr[-2000:]
    assert "no PET_NNODES: the TrainJob needs spec.trainer" in result.stdout + result.stderr
    assert "restarting" not in result.stdout


def test_env_injection_reaches_an_init_container_of_each_node(tmp_path):
    """A runtime whose mlPolicy.torch.envInjection names an init container of the node
    job (v2.3, #3516): on each of two nodes it runs with the torch env -- its node rank, the
    node count, the master address (this machine here) -- before the node container."""
    runtime = yaml.safe_load(policy_runtime(tmp_path, 0).read_text())
    runtime["spec"]["mlPolicy"]["torch"] = {"envInjection": {"targets": [
        {"jobName": "node", "containerNames": ["preflight-check"]}]}}
    script = ("import os, pathlib; e = os.environ; pathlib.Path(e['KUBETUNE_WORKSPACE'], "
              "'preflight-' + e['PET_NODE_RANK']).write_text(' '.join(e[n] for n in ("
              "'PET_NNODES', 'PET_NPROC_PER_NODE', 'PET_MASTER_ADDR', 'PET_MASTER_PORT')))")
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]["spec"]
        if job["name"] == "node":
            pod["initContainers"] = [{"name": "preflight-check",
                                      "command": [sys.executable, "-c", script],
                                      "volumeMounts": pod["containers"][0]["volumeMounts"]}]
    path = tmp_path / "injecting-runtime.yaml"
    path.write_text(yaml.safe_dump(runtime))
    job = trainjob(tmp_path, "kubetune-byo-model", {"trainer": {"numNodes": 2}})
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime", str(path),
                      "--trainjob", str(job), env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    ws = tmp_path / "run" / "workspace"
    for rank in ("0", "1"):
        assert (ws / f"preflight-{rank}").read_text() == "2 auto 127.0.0.1 29500"
