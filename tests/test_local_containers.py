"""`kubetune local --engine podman|docker`: the engine command line built for each
container of a merged runtime, checked without an engine (tests/images runs them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubetune.entrypoints.local import merged_jobset
from kubetune.errors import BadInputError
from kubetune.tools.local.container_argv import (ContainerRun, image_for,
                                                 labelled_containers_argv,
                                                 labelled_networks_argv,
                                                 network_create_argv, run_argv)
from kubetune.tools.local.container_user import EngineFacts, HostUser, run_as
from kubetune.tools.local.containers import (EngineOptions, file_sources,
                                             parse_image_overrides, workdir_identity)
from kubetune.tools.local.jobset import LocalJobSet
from tests.support.cli import clean_env, kubetune
from tests.support.runtimes import initializer_uris, runtime_file, write_trainjob

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")
BASE = Path(__file__).resolve().parents[1] / "runtimes" / "base"


def job_named(jobset: LocalJobSet, name: str) -> dict:
    return next(j for j in jobset.spec["replicatedJobs"] if j["name"] == name)


def engine_jobset(jobset: dict, workdir: Path, options: EngineOptions) -> LocalJobSet:
    """A LocalJobSet whose containers run as this user the way a rootful engine runs them
    (which engines map users how: test_local_container_user; the engines themselves are
    asked in tests/images)."""
    js = LocalJobSet(jobset, workdir, options)
    js.session.run_as = run_as(EngineFacts(options.engine, rootless=False),
                               HostUser.current())
    return js


def container_step(tmp_path: Path, runtime: str, job: str, engine: str = "podman",
                   gpus: bool = False, images: dict | None = None, index: int = 0,
                   trainjob: Path | None = None):
    js = engine_jobset(merged_jobset(runtime_file(runtime), trainjob), tmp_path,
                       EngineOptions(engine, gpus, images or {}))
    js.logs.mkdir(parents=True, exist_ok=True)
    j = job_named(js, job)
    pod = j["template"]["spec"]["template"]["spec"]
    return js, js.step(j, pod["containers"][0], index, 1)


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == option]


def test_trainer_container_runs_the_runtime_command_in_its_image(tmp_path):
    # A TrainJob with spec.trainer: only then does the controller inject PET_* (as upstream).
    job = write_trainjob(tmp_path / "job.yaml", "torchtune-llama3.2-1b",
                         {"trainer": {"numNodes": 1}})
    js, step = container_step(tmp_path, "torchtune-llama3.2-1b.yaml", "node", trainjob=job)
    argv = step.command
    image = argv.index("ghcr.io/kubetune/trainer:0.1.0")
    # command[0] replaces the ENTRYPOINT; the rest of command, then args, follow the image.
    assert option_values(argv, "--entrypoint") == ["tune"]
    assert argv[image + 1:image + 3] == ["run", "--rdzv_endpoint=localhost:29500"]
    assert "output_dir=/workspace/output" in argv[image:]  # paths as the runtime wrote them
    mounts = option_values(argv, "--mount")
    assert f"type=bind,source={tmp_path / 'workspace'},target=/workspace" in mounts
    assert f"type=bind,source={tmp_path / 'logs' / 'node.termination-log'}," \
           "target=/dev/termination-log" in mounts
    assert "/dev/shm" in option_values(argv, "--tmpfs")  # the emptyDir of medium Memory
    # The pod's securityContext, as the kubelet applies it, but for its user: the one
    # running kubetune local, whose files the steps read and write.
    assert option_values(argv, "--user") == [f"{os.geteuid()}:{os.getegid()}"]
    assert option_values(argv, "--group-add")[-1] == "65532"  # fsGroup
    assert "--read-only" in argv and option_values(argv, "--cap-drop") == ["ALL"]
    # Pod DNS: the name PET_MASTER_ADDR holds resolves on the run's network.
    assert option_values(argv, "--network") == [js.session.network]
    assert step.env["PET_MASTER_ADDR"] in option_values(argv, "--network-alias")
    assert {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
            "PET_MASTER_PORT"} <= set(option_values(argv, "-e"))
    assert step.env["PET_NODE_RANK"] == "0"
    assert "--gpus" not in argv and "--device" not in argv  # not asked for


def test_env_values_never_appear_on_the_command_line(tmp_path):
    secret = "hf_s3cr3tTOKENvalue"
    run = ContainerRun(engine="docker", name="x", image="img", command=["kubetune"],
                       env_names=["ACCESS_TOKEN", "STORAGE_URI"])
    argv = run_argv(run)
    assert option_values(argv, "-e")[-2:] == ["ACCESS_TOKEN", "STORAGE_URI"]
    assert not any(secret in a for a in argv)


@pytest.mark.parametrize("engine, flags", [("docker", ["--gpus", "all"]),
                                           ("podman", ["--device", "nvidia.com/gpu=all"])])
def test_gpus_go_to_the_containers_that_request_them(tmp_path, engine, flags):
    _, node = container_step(tmp_path, "torchtune-llama3.2-1b.yaml", "node", engine, True)
    _, init = container_step(tmp_path / "i", "torchtune-llama3.2-1b.yaml",
                             "model-initializer", engine, True)
    joined = " ".join(node.command)
    assert node.command[0] == engine and " ".join(flags) in joined
    assert flags[0] not in init.command  # no GPU request, no GPU (as on the cluster)


def test_a_file_source_is_mounted_read_only_at_its_own_path(tmp_path):
    model = tmp_path / "src" / "model"
    model.mkdir(parents=True)
    job = write_trainjob(tmp_path / "job.yaml", "kubetune-byo-model",
                         initializer_uris(f"file://{model}", "file:///not/on/this/host"))
    _, step = container_step(tmp_path / "run", "kubetune-byo-model.yaml",
                             "model-initializer", trainjob=job)
    assert f"type=bind,source={model},target={model},readonly" in \
        option_values(step.command, "--mount")
    assert step.env["STORAGE_URI"] == f"file://{model}"  # the URI is unchanged
    assert file_sources(["file:///not/on/this/host"]) == []


@pytest.mark.parametrize("engine", ["podman", "docker"])
def test_containers_are_labelled_with_their_workdir_for_the_next_run_to_find(
        tmp_path, monkeypatch, engine):
    """What a `kill -9` leaves running is found by the next run in the same workdir
    (however it is spelled), and by no run elsewhere."""
    js, step = container_step(tmp_path / "run", "kubetune-byo-model.yaml",
                              "model-initializer", engine)
    labels = dict(v.split("=", 1) for v in option_values(step.command, "--label"))
    assert labels["kubetune.local/run"] == js.session.run_id
    assert labels["kubetune.local/pid"] == str(os.getpid())
    workdir_id = labels["kubetune.local/workdir"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "run")
    assert workdir_identity(Path("run")) == workdir_identity(tmp_path / "link") == workdir_id
    assert workdir_identity(tmp_path / "other") != workdir_id
    assert labelled_containers_argv(engine, "kubetune.local/workdir", workdir_id) == [
        engine, "ps", "-a", "--filter", f"label=kubetune.local/workdir={workdir_id}",
        "--format", "{{.Names}}"]
    assert labelled_networks_argv(engine, "kubetune.local/workdir", workdir_id) == [
        engine, "network", "ls", "--filter", f"label=kubetune.local/workdir={workdir_id}",
        "--format", "{{.Name}}"]
    network = network_create_argv(engine, js.session.network, js.session.labels)
    assert network[-1] == js.session.network
    assert f"kubetune.local/workdir={workdir_id}" in option_values(network, "--label")


@pytest.mark.parametrize("model_uri, dataset_uri", [
    ("./src/model", "file://./src/data"),
    ("file://../project/src/model", "src/../src/data"),
])
def test_a_relative_source_is_mounted_from_the_users_directory(tmp_path, monkeypatch,
                                                               model_uri, dataset_uri):
    # `kubetune local --runtime` run from the project directory, its workdir elsewhere: the
    # container (whose own cwd is the image's) gets the absolute path, mounted there.
    from kubetune.tools.local.preflight import resolve_runtime_uris

    project = tmp_path / "project"
    model, data = project / "src" / "model", project / "src" / "data"
    model.mkdir(parents=True)
    data.mkdir(parents=True)
    job = write_trainjob(project / "job.yaml", "kubetune-byo-model",
                         initializer_uris(model_uri, dataset_uri))
    monkeypatch.chdir(project)
    if not dataset_uri.startswith(("./", "file://")):
        # A bare relative name is refused before anything runs, as the initializer would:
        # by the TrainJob's static check, naming its storageUri (issue 53).
        with pytest.raises(BadInputError, match="spec.initializer.dataset.storageUri: .*"
                                                "malformed"):
            merged_jobset(runtime_file("kubetune-byo-model.yaml"), job)
        return
    jobset = merged_jobset(runtime_file("kubetune-byo-model.yaml"), job)
    resolve_runtime_uris(jobset, Path.cwd())
    js = engine_jobset(jobset, tmp_path / "run", EngineOptions("podman"))
    js.logs.mkdir(parents=True, exist_ok=True)
    steps = {}
    for name in ("model-initializer", "dataset-initializer"):
        j = job_named(js, name)
        steps[name] = js.step(j, j["template"]["spec"]["template"]["spec"]["containers"][0],
                              0, 1)
    model_step, data_step = steps["model-initializer"], steps["dataset-initializer"]
    assert f"type=bind,source={model},target={model},readonly" in \
        option_values(model_step.command, "--mount")
    assert f"type=bind,source={data},target={data},readonly" in \
        option_values(data_step.command, "--mount")
    assert model_step.env["STORAGE_URI"] == (
        str(model) if model_uri.startswith(".") else f"file://{model}")
    assert data_step.env["STORAGE_URI"] == f"file://{data}"


def test_a_missing_relative_source_names_the_absolute_path(tmp_path, monkeypatch):
    from kubetune.tools.local.preflight import resolve_runtime_uris

    job = write_trainjob(tmp_path / "job.yaml", "kubetune-byo-model",
                         initializer_uris("./no-such-model", "hf://org/data"))
    monkeypatch.chdir(tmp_path)
    jobset = merged_jobset(runtime_file("kubetune-byo-model.yaml"), job)
    with pytest.raises(BadInputError) as caught:
        resolve_runtime_uris(jobset, Path.cwd())
    assert f"{tmp_path / 'no-such-model'} does not exist ('./no-such-model' relative to " \
        f"{tmp_path})" in caught.value.message


@pytest.mark.parametrize("model, dataset, refused_as_processes", [
    ("hf://org/model", "kubetunetestonly://bucket/data",
     "unsupported storage scheme 'kubetunetestonly'"),
    ("file:///models/baked-into-the-image", "hf://org/data",
     "/models/baked-into-the-image does not exist"),
])
def test_an_images_own_scheme_and_paths_are_left_to_the_image(
        tmp_path, monkeypatch, model, dataset, refused_as_processes):
    # With an engine, a plugin scheme installed only in the image and a path inside the
    # image are the image's business; as processes, this machine must serve both.
    from kubetune.tools.local.preflight import resolve_runtime_uris

    job = write_trainjob(tmp_path / "job.yaml", "kubetune-byo-model",
                         initializer_uris(model, dataset))
    monkeypatch.chdir(tmp_path)
    resolve_runtime_uris(merged_jobset(runtime_file("kubetune-byo-model.yaml"), job),
                         Path.cwd(), in_images=True)
    with pytest.raises(BadInputError, match=refused_as_processes):
        resolve_runtime_uris(merged_jobset(runtime_file("kubetune-byo-model.yaml"), job),
                             Path.cwd())


def test_image_overrides_by_name_or_reference():
    overrides = parse_image_overrides(["trainer=localhost/t:dev",
                                       "ghcr.io/kubetune/exporter:0.1.0=localhost/e:dev"])
    assert image_for("ghcr.io/kubetune/trainer:0.1.0", overrides) == "localhost/t:dev"
    assert image_for("ghcr.io/kubetune/exporter:0.1.0", overrides) == "localhost/e:dev"
    assert image_for("ghcr.io/kubetune/initializer:0.1.0", overrides) == \
        "ghcr.io/kubetune/initializer:0.1.0"
    with pytest.raises(BadInputError, match="NAME=IMAGE"):
        parse_image_overrides(["trainer"])


def test_engine_options_need_a_runtime_and_an_engine(tmp_path):
    result = kubetune("local", "--engine", "podman", "--workdir", str(tmp_path),
                      env=clean_env())
    assert result.returncode == 65 and "give --runtime" in result.stderr
    result = kubetune("local", "--gpus", "--runtime", str(BASE / "kubetune-byo-model.yaml"),
                      "--workdir", str(tmp_path), env=clean_env())
    assert result.returncode == 65 and "need a container engine" in result.stderr


def byo_runtime_exporting_to(tmp_path: Path, export_uri: str) -> Path:
    """kubetune-byo-model with its exporter's EXPORT_URI set to ``export_uri``."""
    import yaml

    runtime = yaml.safe_load(runtime_file("kubetune-byo-model.yaml").read_text())
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        for c in job["template"]["spec"]["template"]["spec"]["containers"]:
            for var in c.get("env") or []:
                if var["name"] == "EXPORT_URI":
                    var["value"] = export_uri
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(runtime))
    return path


@pytest.mark.parametrize("export_uri, exists", [
    ("{project}/exports/tiny", False), ("./exports/tiny", False),
    ("file://./exports/tiny", False), ("file://{project}/exports/tiny", True)])
def test_a_host_export_destination_is_mounted_read_write_at_its_own_path(
        tmp_path, monkeypatch, export_uri, exists):
    # The exporter in its container writes where the URI says, on this host: the
    # destination (made here if missing) bind-mounted writable, the URI unchanged.
    from kubetune.tools.local.preflight import resolve_runtime_uris

    project = tmp_path / "project"
    project.mkdir()
    destination = project / "exports" / "tiny"
    if exists:  # the user's own directory: mounted as it is, its mode untouched
        destination.mkdir(parents=True, mode=0o750)
    monkeypatch.chdir(project)
    runtime = byo_runtime_exporting_to(tmp_path, export_uri.format(project=project))
    jobset = merged_jobset(runtime, None)
    resolve_runtime_uris(jobset, Path.cwd(), in_images=True)
    js = engine_jobset(jobset, tmp_path / "run", EngineOptions("podman"))
    js.logs.mkdir(parents=True, exist_ok=True)
    j = job_named(js, "exporter")
    step = js.step(j, j["template"]["spec"]["template"]["spec"]["containers"][0], 0, 1)
    mounts = option_values(step.command, "--mount")
    assert f"type=bind,source={destination},target={destination}" in mounts
    assert not any(f"target={destination}," in m for m in mounts)  # not read-only too
    assert destination.is_dir()
    # Made here: the umask's mode (the container runs as this user), not one anybody
    # may write.
    umask = os.umask(0)
    os.umask(umask)
    assert destination.stat().st_mode & 0o777 == (0o750 if exists else 0o777 & ~umask)
    assert step.env["EXPORT_URI"] in (str(destination), f"file://{destination}")


@pytest.mark.parametrize("export_uri", ["s3://bucket/exports/tiny", "/workspace/export"])
def test_a_remote_or_workspace_export_gets_no_mount_of_its_own(tmp_path, export_uri):
    runtime = byo_runtime_exporting_to(tmp_path, export_uri)
    js = engine_jobset(merged_jobset(runtime, None), tmp_path / "run",
                       EngineOptions("podman"))
    js.logs.mkdir(parents=True, exist_ok=True)
    j = job_named(js, "exporter")
    step = js.step(j, j["template"]["spec"]["template"]["spec"]["containers"][0], 0, 1)
    targets = [m.split("target=")[1].split(",")[0]
               for m in option_values(step.command, "--mount")]
    assert sorted(targets) == ["/dev/termination-log", "/tmp", "/workspace"]
    assert step.env["EXPORT_URI"] == export_uri
