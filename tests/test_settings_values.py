"""Settings' values checked before any step, by the parsers their steps use, and named as
the user wrote them (issue 53 §2, §3): a YAML path (`spec.trainer.env[2]`), a variable
(`KUBETUNE_VAL_FRACTION`), an option (`--val-fraction`) or, in a `tune run` override, the
key itself. In-process where no process boundary is under test; no torch, no training."""

from __future__ import annotations

import pytest
import yaml

from kubetune.entrypoints.step_options import settings_check
from kubetune.entrypoints.validate import check
from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.runtimes import runtime_file, write_trainjob

BYO = "kubetune-byo-model"
CHECK = settings_check()
RANGE = "the held-out fraction must be more than 0 and at most 0.5"

# (variable, value, what the refusal says): one per kind of value the issue names.
BAD_VALUES = [
    ("KUBETUNE_VAL_FRACTION", "0.9", RANGE),
    ("KUBETUNE_EPOCHS", "0", "must be a whole number >= 1"),
    ("KUBETUNE_EPOCHS", "two", "'two' is not a valid integer"),
    ("KUBETUNE_LORA_DROPOUT", "1.5", "must be a number in [0, 1)"),
    ("KUBETUNE_LEARNING_RATE", "0", "must be a number > 0"),
    ("KUBETUNE_VAL_PROMPTS", "-1", "must be 0 or more"),
    ("KUBETUNE_METHOD", "lorax", "'lorax' is not one of 'lora', 'qlora', 'dora', 'full'"),
    ("KUBETUNE_OBJECTIVE", "ppo", "'ppo' is not one of"),
    ("EXPORT_FORMAT", "gguf", "is not one of adapter, merged, both"),
    ("KUBETUNE_EXPORT_CHECKPOINT", "middle", "'middle' is not one of 'last', 'best'"),
    ("KUBETUNE_PACKING", "maybe", "'maybe' is not a valid boolean"),
    ("KUBETUNE_DOWNLOAD_WORKERS", "0", "must be at least 1"),
    ("KUBETUNE_S3_PART_SIZE_MB", "16MB", "is not a whole number"),
    ("KUBETUNE_HTTP_TIMEOUT_S", "60s", "is not a number"),
    ("LORA_CONFIG", "{r: 8}", "LORA_CONFIG is not a JSON object"),
    ("KUBETUNE_LORA_TARGET_MODULES", "attn", "LoRA target module 'attn' is not one of"),
    ("STORAGE_URI", "data/train", "storage URI 'data/train' is malformed"),
    ("STORAGE_URI", "hf://", "names nothing after hf://"),
    ("EXPORT_URI", "gs://bucket/out", "EXPORT_URI 'gs://bucket/out' is not supported"),
    ("KUBETUNE_TEACHER_URI", "s3://", "names nothing after s3://"),
]
GOOD_VALUES = [("KUBETUNE_VAL_FRACTION", "0.1"), ("KUBETUNE_EPOCHS", "2"),
               ("KUBETUNE_PACKING", "true"), ("EXPORT_FORMAT", "merged"),
               ("KUBETUNE_EXPORT_CHECKPOINT", "best"), ("STORAGE_URI", "hf://org/model"),
               ("KUBETUNE_DOWNLOAD_WORKERS", "4"), ("KUBETUNE_METHOD", "qlora")]


@pytest.mark.parametrize("name, value, said", BAD_VALUES,
                         ids=[f"{n}={v}" for n, v, _ in BAD_VALUES])
def test_a_bad_value_is_refused_by_its_steps_parser(name, value, said):
    problem = CHECK.value_problem(name, value)
    assert problem is not None and said in problem, problem


@pytest.mark.parametrize("name, value", GOOD_VALUES)
def test_a_good_value_passes(name, value):
    assert CHECK.value_problem(name, value) is None


def _runtime_with(tmp_path, name: str, value: str) -> tuple:
    runtime = yaml.safe_load(runtime_file(BYO).read_text())
    node = next(j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                if j["name"] == "node")["template"]["spec"]["template"]["spec"]["containers"][0]
    node["env"].append({"name": name, "value": value})
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(runtime))
    return path, len(node["env"]) - 1


def test_validate_refuses_a_runtimes_value_naming_the_env_entry(tmp_path, capsys):
    path, i = _runtime_with(tmp_path, "KUBETUNE_VAL_FRACTION", "0.9")
    assert check(path, None) == 65
    assert capsys.readouterr().err.splitlines() == [
        f"error: validate: {path}: replicatedJobs[node].template.spec.template.spec."
        f"containers[node].env[{i}]: KUBETUNE_VAL_FRACTION=\"0.9\": {RANGE}"]


def test_local_refuses_a_runtimes_value_before_either_initializer(tmp_path):
    path, i = _runtime_with(tmp_path, "KUBETUNE_VAL_FRACTION", "0.9")
    workdir = tmp_path / "run"
    result = kubetune("local", "--workdir", str(workdir), "--runtime", str(path),
                      env=clean_env())
    assert result.returncode == 65, result.stdout + result.stderr
    assert error_lines(result) == [
        f"error: local: {path}: replicatedJobs[node].template.spec.template.spec."
        f"containers[node].env[{i}]: KUBETUNE_VAL_FRACTION=\"0.9\": {RANGE}"]
    assert "==> " not in result.stdout and not workdir.exists()


def test_a_trainjobs_values_are_named_by_their_yaml_path(tmp_path, capsys):
    job = write_trainjob(tmp_path / "job.yaml", BYO, {
        "initializer": {"model": {"storageUri": "s3://"}},
        "trainer": {"env": [{"name": "KUBETUNE_EPOCHS", "value": "1"},
                            {"name": "KUBETUNE_LORA_RANK", "value": "8"},
                            {"name": "KUBETUNE_VAL_FRACTION", "value": "0.9"},
                            {"name": "KUBETUNE_PACKING", "value": "maybe"},
                            {"name": "KUBETUNE_EPOCHS", "value": "$(EPOCHS)"}]}})
    assert check(runtime_file(BYO), job) == 65
    lines = capsys.readouterr().err.splitlines()
    assert lines == sorted(lines) and len(lines) == 3, lines
    assert lines[0].startswith(f"error: validate: {job}: spec.initializer.model.storageUri: "
                               "'s3://': storage URI 's3://' names nothing after s3://")
    assert lines[1] == (f"error: validate: {job}: spec.trainer.env[2]: "
                        f"KUBETUNE_VAL_FRACTION=\"0.9\": {RANGE}")
    assert lines[2].startswith(f"error: validate: {job}: spec.trainer.env[3]: "
                               "KUBETUNE_PACKING=\"maybe\": 'maybe' is not a valid boolean")
    assert CHECK.trainjob_problems(yaml.safe_load(job.read_text()))  # the same, without file


def test_local_names_the_option_and_the_variable_as_set(tmp_path):
    """`--val-fraction 0.9` names --val-fraction; KUBETUNE_VAL_FRACTION=0.9 names the
    variable; neither names kubetune.val_fraction, and neither leaves a workdir."""
    workdir = tmp_path / "run"
    result = kubetune("local", "--workdir", str(workdir), "--val-fraction", "0.9",
                      env=clean_env())
    assert result.returncode == 65, result.stderr
    assert error_lines(result) == [f"error: local: --val-fraction 0.9: {RANGE}"]
    result = kubetune("local", "--workdir", str(workdir), env=clean_env(
        KUBETUNE_VAL_FRACTION="0.9", KUBETUNE_EPOCHS="0"))
    assert result.returncode == 65, result.stderr
    assert error_lines(result) == ["error: local: KUBETUNE_EPOCHS=0: must be a whole number >= 1",
                                   f"error: local: KUBETUNE_VAL_FRACTION=0.9: {RANGE}"]
    assert not workdir.exists()


def test_the_shells_variables_of_every_step_are_checked():
    """Every step of `kubetune local` inherits the shell: an initializer's or the
    exporter's variable is checked too, except those `kubetune local` sets itself."""
    lines = CHECK.shell_problems({"KUBETUNE_DOWNLOAD_WORKERS": "0", "EXPORT_FORMAT": "gguf",
                                  "STORAGE_URI": "data/x", "KUBETUNE_EPOCHS": "2"}, {},
                                 frozenset({"STORAGE_URI"}))
    assert lines == ["EXPORT_FORMAT=gguf: 'gguf' is not one of adapter, merged, both",
                     "KUBETUNE_DOWNLOAD_WORKERS=0: must be at least 1"]


def test_a_typed_option_wins_over_its_variable():
    assert CHECK.shell_problems({"KUBETUNE_VAL_FRACTION": "0.9"}, {"val_fraction": 0.2}) == []
    assert CHECK.shell_problems({"KUBETUNE_VAL_FRACTION": "0.2"}, {"val_fraction": 0.9}) == [
        f"--val-fraction 0.9: {RANGE}"]


@pytest.mark.parametrize("spellings, said", [
    ({}, "kubetune.val_fraction=0.9: "),  # a `tune run` override: the key as written
    ({"kubetune.val_fraction": "--val-fraction"}, "--val-fraction 0.9: "),
    ({"kubetune.val_fraction": "KUBETUNE_VAL_FRACTION"}, "KUBETUNE_VAL_FRACTION=0.9: "),
])
def test_the_trainers_own_check_names_the_setting(spellings, said):
    """The trainer's check stays for values that reach it another way, and names what
    set them: the plan's held-out fraction and its ranges of the merged config."""
    from omegaconf import OmegaConf

    from kubetune.errors import BadInputError
    from kubetune.trainer.config.validate import check_values
    from kubetune.trainer.validation.held_out_set import fraction_of

    with pytest.raises(BadInputError) as err:
        fraction_of(OmegaConf.create({"kubetune": {"val_fraction": 0.9}}), spellings)
    assert str(err.value).startswith(said + RANGE), err.value
    epochs = {key.replace("kubetune.val_fraction", "epochs"): name.replace(
        "val-fraction", "epochs").replace("VAL_FRACTION", "EPOCHS")
        for key, name in spellings.items()}
    with pytest.raises(BadInputError) as err:
        check_values(OmegaConf.create({"epochs": 0, "batch_size": 1,
                                       "gradient_accumulation_steps": 1}), epochs)
    assert str(err.value) == said.replace("kubetune.val_fraction", "epochs").replace(
        "val-fraction", "epochs").replace("VAL_FRACTION", "EPOCHS").replace(
        "0.9", "0") + "must be a whole number >= 1"


def test_a_held_out_set_or_teacher_named_on_a_missing_path_is_refused(tmp_path):
    """Before any step, also where a remote source keeps the trainer's plan from running
    here; a path in the workspace is the steps' to fill."""
    from kubetune.errors import BadInputError
    from kubetune.tools.local.preflight import check_named_paths

    pvc = tmp_path / "run" / "workspace"
    there = tmp_path / "val.json"
    there.write_text("[]")
    check_named_paths([f"dataset_val.data_files={there}", f"dataset_val.data_dir={pvc}/val",
                       "dataset.data_dir=/nowhere", "epochs=1"], pvc)
    for arg, said in [
            ("dataset_val.data_files=/nowhere/val.json", "/nowhere/val.json does not exist"),
            (f"dataset_val.data_files=[{there}, /nowhere/b.json]",
             "/nowhere/b.json does not exist"),
            ("dataset_val.data_dir=/nowhere", "/nowhere does not exist"),
            ("teacher_checkpointer.checkpoint_dir=/nowhere/teacher",
             "/nowhere/teacher does not exist")]:
        with pytest.raises(BadInputError) as err:
            check_named_paths([arg], pvc)
        assert str(err.value) == f"{arg}: {said}"


def test_the_trainer_names_the_held_out_sections_paths_as_dataset_val(tmp_path):
    from omegaconf import OmegaConf

    from kubetune.errors import BadInputError
    from kubetune.trainer.data.dataset_location import locate

    cfg = OmegaConf.create({"data_dir": str(tmp_path / "missing")})
    with pytest.raises(BadInputError, match=r"^dataset_val\.data_dir .*missing does not exist"):
        locate(cfg, tmp_path, "dataset_val")


def test_a_runtimes_held_out_set_on_a_missing_path_is_refused_before_any_step(tmp_path):
    """As processes, a TrainJob's dataset_val on a path of this machine that is not there
    (not under one of the node container's mounts) is refused before the initializers."""
    from kubetune.entrypoints.local import merged_jobset
    from kubetune.errors import BadInputError
    from kubetune.tools.local.preflight import check_runtime_named_paths

    job = write_trainjob(tmp_path / "job.yaml", BYO, {"trainer": {"args": [
        "dataset_val=torchtune.datasets.instruct_dataset",
        "dataset_val.data_files=/nowhere/val.json"]}})
    with pytest.raises(BadInputError) as err:
        check_runtime_named_paths(merged_jobset(runtime_file(BYO), job))
    assert str(err.value) == ("container node of job node: dataset_val.data_files="
                              "/nowhere/val.json: /nowhere/val.json does not exist")
    on_the_volume = write_trainjob(tmp_path / "job2.yaml", BYO, {"trainer": {"args": [
        "dataset_val.data_files=/workspace/val.json"]}})
    check_runtime_named_paths(merged_jobset(runtime_file(BYO), on_the_volume))
