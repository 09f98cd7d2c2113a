"""A runtime author's mistakes, each one `error:` line (exit 65) naming the file, the job,
the container and the field, before any step runs: `kubetune validate`, `kubetune local
--runtime` and `--print-jobset` (kubetune/tools/local/runtime_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kubetune.tools.local.containers import pull_failure
from kubetune.tools.local.runtime_contract import runtime_problems
from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.runtimes import runtime_file, runtime_files, write_trainjob

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")
BYO = "kubetune-byo-model"
POD = "template.spec.template.spec"


def byo() -> dict:
    return yaml.safe_load(runtime_file(BYO).read_text())


def job(runtime: dict, name: str) -> dict:
    return next(j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                if j["name"] == name)


def container(runtime: dict, name: str) -> dict:
    return job(runtime, name)["template"]["spec"]["template"]["spec"]["containers"][0]


def unnamed(r: dict) -> None:
    del container(r, "node")["name"]


def renamed(r: dict) -> None:
    container(r, "node")["name"] = "trainer"


def unlabelled(r: dict) -> None:
    del job(r, "node")["template"]["metadata"]["labels"]


def no_pvc_in_node(r: dict) -> None:
    c = container(r, "node")
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/workspace"]


def no_pvc_in_exporter(r: dict) -> None:
    c = container(r, "exporter")
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/workspace"]


def unknown_setting(r: dict) -> None:
    container(r, "node")["env"].append({"name": "KUBETUNE_EPOCH", "value": "1"})


def renamed_initializer(r: dict) -> None:
    container(r, "model-initializer")["name"] = "model-init"
    for rule in job(r, "model-initializer")["template"]["spec"]["podFailurePolicy"]["rules"]:
        if "onExitCodes" in rule:
            rule["onExitCodes"]["containerName"] = "model-init"


def policy_typo(r: dict) -> None:
    rules = job(r, "exporter")["template"]["spec"]["podFailurePolicy"]["rules"]
    rules[0]["onExitCodes"]["containerName"] = "exporterr"


def undefined_volume(r: dict) -> None:
    container(r, "exporter")["volumeMounts"][1]["name"] = "tpm"


def depends_on_typo(r: dict) -> None:
    job(r, "exporter")["dependsOn"][0]["name"] = "nodes"


MISTAKES = [
    # The CRD schema requires a container's name: reading the file refuses it first.
    (unnamed, f"spec.template.spec.replicatedJobs[2].{POD}.containers[0].name: required "
              "field missing; kubectl apply refuses"),
    (renamed, f"replicatedJobs[node].{POD}.containers[trainer].name: 'trainer' is not node;"),
    (unlabelled, "replicatedJobs[node].template.metadata.labels: no job labelled "
                 "trainer.kubeflow.org/trainjob-ancestor-step: trainer;"),
    (no_pvc_in_node, f"replicatedJobs[node].{POD}.containers[node].volumeMounts: nothing "
                     "mounted at /workspace;"),
    (no_pvc_in_exporter, f"replicatedJobs[exporter].{POD}.containers[exporter].volumeMounts: "
                         "nothing mounted at /workspace;"),
    (unknown_setting, f"replicatedJobs[node].{POD}.containers[node].env[KUBETUNE_EPOCH]: "
                      "no part of kubetune reads KUBETUNE_EPOCH; did you mean KUBETUNE_EPOCHS?"),
    (renamed_initializer, f"replicatedJobs[model-initializer].{POD}.containers[model-init]."
                          "name: 'model-init' is not model-initializer;"),
    (policy_typo, "replicatedJobs[exporter].template.spec.podFailurePolicy.rules[0]."
                  "onExitCodes.containerName: 'exporterr' is no container of this job; "
                  "name exporter"),
    (undefined_volume, f"replicatedJobs[exporter].{POD}.containers[exporter].volumeMounts[tpm]"
                       ": no volume or volumeClaimPolicies claim named tpm (did you mean tmp?)"),
    (depends_on_typo, "replicatedJobs[exporter].dependsOn[0].name: no replicatedJob named "
                      "nodes (did you mean node?)"),
]


def broken(tmp_path: Path, mistake) -> Path:
    runtime = byo()
    mistake(runtime)
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(runtime))
    return path


@pytest.mark.parametrize("mistake, line", MISTAKES, ids=[m.__name__ for m, _ in MISTAKES])
def test_validate_names_each_mistake_in_one_line(tmp_path, mistake, line):
    path = broken(tmp_path, mistake)
    result = kubetune("validate", str(path))
    assert result.returncode == 65, result.stdout + result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: validate: {path}: {line}"), result.stderr


@pytest.mark.parametrize("mistake, line", MISTAKES[:4], ids=[m.__name__ for m, _ in MISTAKES[:4]])
def test_local_refuses_each_mistake_before_any_step(tmp_path, mistake, line):
    path = broken(tmp_path, mistake)
    for extra in ([], ["--print-jobset"]):
        result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime", str(path),
                          *extra, env=clean_env())
        assert result.returncode == 65, result.stdout + result.stderr
        assert len(error_lines(result)) == 1, result.stderr
        assert error_lines(result)[0].startswith(f"error: local: {path}: {line}")
        assert "==> " not in result.stdout and "apiVersion" not in result.stdout
    assert not (tmp_path / "run" / "workspace").exists()


def test_every_mistake_at_once(tmp_path):
    runtime = byo()
    for mistake in (unnamed, no_pvc_in_exporter, unknown_setting):
        mistake(runtime)
    lines = runtime_problems(runtime)
    assert len(lines) == 3, lines


def test_unknown_setting_in_the_trainjob_names_the_trainjob(tmp_path):
    trainjob = write_trainjob(tmp_path / "job.yaml", BYO, {"trainer": {"env": [
        {"name": "KUBETUNE_LORA_RANKK", "value": "4"}]}})
    result = kubetune("validate", str(runtime_file(BYO)), str(trainjob))
    assert result.returncode == 65
    assert error_lines(result) == [
        f"error: validate: {trainjob}: spec.trainer.env[KUBETUNE_LORA_RANKK]: no part of kubetune reads "
        "KUBETUNE_LORA_RANKK; did you mean KUBETUNE_LORA_RANK?"]


@pytest.mark.parametrize("path", runtime_files(), ids=lambda p: p.name)
def test_our_runtimes_keep_the_contract(path):
    assert runtime_problems(yaml.safe_load(path.read_text())) == []


def test_validate_passes_a_good_pair(tmp_path):
    trainjob = write_trainjob(tmp_path / "job.yaml", BYO, {"trainer": {"env": [
        {"name": "KUBETUNE_LORA_RANK", "value": "4"}]}})
    result = kubetune("validate", str(runtime_file(BYO)), str(trainjob))
    assert result.returncode == 0, result.stderr
    assert "ok: " in result.stdout and "node -> exporter" in result.stdout


def test_validate_help_works_without_the_torch_stack():
    result = kubetune("validate", "--help")
    assert result.returncode == 0 and "RUNTIME [TRAINJOB]" in result.stdout


def test_builder_that_does_not_import_is_one_line_before_any_step(tmp_path):
    """The trainer's `_component_` module is imported as the node container will import
    it (its PYTHONPATH), before the initializers run: its cause in the one line."""
    model, dataset = tmp_path / "model", tmp_path / "dataset"
    model.mkdir(), dataset.mkdir()
    trainjob = write_trainjob(tmp_path / "job.yaml", BYO, {
        "initializer": {"model": {"storageUri": f"file://{model}"},
                        "dataset": {"storageUri": f"file://{dataset}"}},
        "trainer": {"args": ["dataset._component_=acme_datasetz.calc_chat_dataset"]}})
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime",
                      str(runtime_file(BYO)), "--trainjob", str(trainjob), env=clean_env())
    assert result.returncode == 65, result.stdout[-2000:] + result.stderr
    assert error_lines(result) == [
        "error: local: container node of job node: dataset._component_=acme_datasetz."
        "calc_chat_dataset: cannot import acme_datasetz: ModuleNotFoundError: No module named "
        "'acme_datasetz'; put its directory on the container's PYTHONPATH (a ConfigMap "
        "volume: --configmap NAME=DIR) or install it in the trainer image"]
    assert "==> " not in result.stdout and "Traceback" not in result.stderr


def test_builder_that_does_not_import_is_refused_by_the_trainer_plan(tmp_path):
    from kubetune.errors import BadInputError
    from kubetune.trainer.config.config_keys import _check_import

    with pytest.raises(BadInputError, match=r"cannot import acme_datasetz: "
                                            r"ModuleNotFoundError: No module named 'acme_datasetz'"):
        _check_import("dataset._component_", "acme_datasetz.calc_chat_dataset")
    _check_import("dataset._component_", "torchtune.datasets.alpaca_dataset")  # shipped


CONFIGMAP_VOLUME = {"name": "builders", "configMap": {"name": "my-builders"}}


def configmap_runtime(tmp_path: Path) -> Path:
    runtime = byo()
    pod = job(runtime, "node")["template"]["spec"]["template"]["spec"]
    pod["volumes"].append(CONFIGMAP_VOLUME)
    node = container(runtime, "node")
    node["volumeMounts"].append({"name": "builders", "mountPath": "/opt/custom"})
    node["env"].append({"name": "PYTHONPATH", "value": "/opt/custom"})
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(runtime))
    return path


def test_configmap_volume_without_a_directory_is_refused_saying_how(tmp_path):
    model, dataset = tmp_path / "model", tmp_path / "dataset"
    model.mkdir(), dataset.mkdir()
    trainjob = write_trainjob(tmp_path / "job.yaml", BYO, {"initializer": {
        "model": {"storageUri": f"file://{model}"},
        "dataset": {"storageUri": f"file://{dataset}"}}})
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime",
                      str(configmap_runtime(tmp_path)), "--trainjob", str(trainjob),
                      env=clean_env())
    assert result.returncode == 65
    assert error_lines(result) == [
        "error: local: container node: volume builders is ConfigMap my-builders, which does "
        "not exist here; give a directory holding its files: kubetune local --configmap "
        "my-builders=DIR (or KUBETUNE_LOCAL_CONFIGMAPS='my-builders=DIR')"]


def test_configmap_directory_is_mounted_for_the_process_engine(tmp_path):
    """--configmap NAME=DIR: the node container's /opt/custom is DIR, so its builder
    imports (checked before any step, as the trainer will import it)."""
    from kubetune.entrypoints.local import merged_jobset
    from kubetune.tools.local.jobset import LocalJobSet, parse_configmaps
    from kubetune.tools.local.preflight import check_runtime_components

    builders = tmp_path / "builders"
    builders.mkdir()
    (builders / "acme_datasets.py").write_text("def chat(**kwargs):\n    return None\n")
    trainjob = write_trainjob(tmp_path / "job.yaml", BYO, {"trainer": {
        "args": ["dataset._component_=acme_datasets.chat"]}})
    jobset = merged_jobset(configmap_runtime(tmp_path), trainjob)
    run = LocalJobSet(jobset, tmp_path / "run",
                      configmaps=parse_configmaps([f"my-builders={builders}"]))
    run.check()
    node = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == "node")
    step = run.step(node, node["template"]["spec"]["template"]["spec"]["containers"][0], 0, 1)
    assert step.env["PYTHONPATH"] == str(builders)
    check_runtime_components(run)  # imports
    (builders / "acme_datasets.py").unlink()
    with pytest.raises(Exception, match="No module named 'acme_datasets'"):
        check_runtime_components(run)


def test_configmap_option_needs_a_runtime(tmp_path):
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--configmap",
                      f"x={tmp_path}", env=clean_env())
    assert result.returncode == 65
    assert "--configmap needs --runtime" in error_lines(result)[0]


# As podman 5 and docker 27 print a pull that fails (recorded).
PODMAN_PULL = (
    "Trying to pull ghcr.io/kubetune/trainerx:0.1.0...\n"
    "Error: initializing source docker://ghcr.io/kubetune/trainerx:0.1.0: reading manifest "
    "0.1.0 in ghcr.io/kubetune/trainerx: manifest unknown\n")
DOCKER_PULL = (
    "Error response from daemon: pull access denied for acme/trainer, repository does not "
    "exist or may require 'docker login': denied: requested access to the resource is "
    "denied\n")


@pytest.mark.parametrize("engine, stderr, cause", [
    ("podman", PODMAN_PULL, "reading manifest 0.1.0 in ghcr.io/kubetune/trainerx: manifest "
                            "unknown"),
    ("docker", DOCKER_PULL, "pull access denied for acme/trainer"),
])
def test_image_that_cannot_be_pulled_is_one_line(engine, stderr, cause):
    line = pull_failure("ghcr.io/kubetune/trainerx:0.1.0", "replicatedJobs[node] container "
                        "node", engine, stderr)
    assert line is not None and "\n" not in line
    assert line.startswith("replicatedJobs[node] container node: image "
                           "ghcr.io/kubetune/trainerx:0.1.0 could not be pulled")
    assert cause in line and "--image NAME=IMAGE" in line
    assert pull_failure("x", "y", engine, "Error: container exited: OOM\n") is None


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "own-runtime"


def test_example_runtime_validates():
    result = kubetune("validate", str(EXAMPLE / "runtime.yaml"), str(EXAMPLE / "trainjob.yaml"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: ")


@pytest.mark.slow
def test_example_runtime_runs_with_its_builder_from_a_configmap_directory(
        tmp_path, tiny_model_dir, tiny_dataset_dir):
    """docs/extending.md's own runtime, as its author runs it here: the TrainJob's
    storageUris pointed at the tiny model and dataset, the ConfigMap from the example's
    builder directory; three steps of LoRA through that builder, then the export."""
    trainjob = yaml.safe_load((EXAMPLE / "trainjob.yaml").read_text())
    trainjob["spec"]["initializer"] = {"model": {"storageUri": f"file://{tiny_model_dir}"},
                                       "dataset": {"storageUri": f"file://{tiny_dataset_dir}"}}
    job_path = tmp_path / "trainjob.yaml"
    job_path.write_text(yaml.safe_dump(trainjob))
    builders = EXAMPLE.parents[0] / "custom-dataset"
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime",
                      str(EXAMPLE / "runtime.yaml"), "--trainjob", str(job_path),
                      "--configmap", f"my-builders={builders}", env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "arithmetic_chat_dataset: 512 conversations" in result.stdout
    ws = tmp_path / "run" / "workspace"
    assert json.loads((ws / "output" / "summary.json").read_text())["steps"] == 3
    assert (ws / "export" / "adapter_model.safetensors").is_file()
