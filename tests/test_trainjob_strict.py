"""TrainJobs and runtimes checked as `kubectl apply` checks them (issue 43 §3): an unknown
field or a wrong type is exit 65 before anything runs, in one line naming the file, the
path and the field meant; what the SDK and our runtimes write still passes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from kubetune.tools.local import crd_schema_gen, manifest_schema
from kubetune.tools.local.runtime_spec import load_runtime, load_trainjob
from kubetune.errors import BadInputError
from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.crd_schema import CRDS, validate
from tests.support.runtimes import runtime_file, runtime_files, write_trainjob
from tests.support.sdk_trainjob import sdk_trainjob_spec

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")

RUNTIME = "kubetune-byo-model"
SOURCES = {"model": {"storageUri": "file:///models/tiny"},
           "dataset": {"storageUri": "file:///data/tiny"}}

# Typed by hand: (spec, the path named, the field it meant).
TYPOS = [
    ({"initializer": {"model": SOURCES["model"],
                      "dataset": {"storageURI": "file:///data/tiny"}}},
     "spec.initializer.dataset.storageURI", "storageUri"),
    ({"initialiser": SOURCES}, "spec.initialiser", "initializer"),
    ({"initializer": SOURCES, "trainer": {"numProcsPerNode": 2}},
     "spec.trainer.numProcsPerNode", "numProcPerNode"),
    ({"initializer": SOURCES, "trainer": {"env": [{"name": "KUBETUNE_EPOCHS", "vaule": "1"}]}},
     "spec.trainer.env[0].vaule", "value"),
    ({"initializer": SOURCES, "trainer": {"resourcePerNode": {"limits": {"cpu": 2}}}},
     "spec.trainer.resourcePerNode", "resourcesPerNode"),
]
# Wrong types the API server refuses: (spec, path, what the line says).
WRONG_TYPES = [
    ({"initializer": SOURCES, "trainer": {"env": [{"name": "KUBETUNE_EPOCHS", "value": 1}]}},
     "spec.trainer.env[0].value", "expected a string, got the number 1"),
    ({"initializer": SOURCES, "trainer": {"numNodes": "2"}},
     "spec.trainer.numNodes", "expected an integer"),
    ({"initializer": SOURCES, "trainer": {"args": "epochs=1"}},
     "spec.trainer.args", "expected a list"),
    ({"initializer": SOURCES, "suspend": "no"}, "spec.suspend", "expected true or false"),
]


def _job(tmp_path: Path, spec: dict) -> Path:
    return write_trainjob(tmp_path / "job.yaml", RUNTIME, spec)


def _api_refuses(job: Path) -> bool:
    """Whether the API server's own check (the full CRD schema, where the CRDs are here)
    refuses the TrainJob too: ours is no stricter than kubectl's."""
    return not CRDS.is_dir() or bool(validate(yaml.safe_load(job.read_text())))


@pytest.mark.parametrize("spec,path,meant", TYPOS, ids=[t[1] for t in TYPOS])
def test_a_misspelt_trainjob_field_is_named_with_the_one_meant(tmp_path, spec, path, meant):
    job = _job(tmp_path, spec)
    assert _api_refuses(job), "the API server would accept it"
    with pytest.raises(BadInputError) as err:
        load_trainjob(job)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{job}: {path}: unknown field"), line
    assert f"did you mean {meant}?" in line, line


@pytest.mark.parametrize("spec,path,said", WRONG_TYPES, ids=[t[1] for t in WRONG_TYPES])
def test_a_wrongly_typed_trainjob_value_is_refused(tmp_path, spec, path, said):
    job = _job(tmp_path, spec)
    assert _api_refuses(job), "the API server would accept it"
    with pytest.raises(BadInputError) as err:
        load_trainjob(job)
    assert str(err.value).startswith(f"{job}: {path}: {said}"), err.value


def test_a_misspelt_metadata_field_and_several_mistakes_at_once(tmp_path):
    job = _job(tmp_path, {"initialiser": SOURCES, "trainer": {"numNodes": "2"}})
    doc = yaml.safe_load(job.read_text())
    doc["metadata"]["lables"] = {"team": "a"}
    job.write_text(yaml.safe_dump(doc))
    found = manifest_schema.problems(doc)
    assert len(found) == 3, found
    assert "metadata.lables: unknown field (did you mean labels?)" in found
    with pytest.raises(BadInputError) as err:
        load_trainjob(job)
    # Every one, sorted by path, each its own line (ContractError.lines).
    assert err.value.lines == [f"{job}: {line}; kubectl apply refuses this TrainJob too"
                               for line in sorted(found)]


def test_three_mistakes_are_three_lines_in_one_run(tmp_path):
    """The issue's TrainJob: three typos, three `error:` lines, one exit 65, in text and
    in JSON lines, from `kubetune validate` and `kubetune local --print-jobset` alike."""
    job = _job(tmp_path, {"initializer": {"model": SOURCES["model"], "dataset": {
        "storageURI": "file:///data/tiny"}}, "trainer": {
        "numProcsPerNode": 2, "env": [{"name": "KUBETUNE_EPOCHS", "value": 3}]}})
    said = [f"{job}: spec.initializer.dataset.storageURI: unknown field (did you mean "
            "storageUri?)",
            f"{job}: spec.trainer.env[0].value: expected a string, got the number 3",
            f"{job}: spec.trainer.numProcsPerNode: unknown field (did you mean "
            "numProcPerNode?)"]
    result = kubetune("validate", str(runtime_file(RUNTIME)), str(job))
    assert result.returncode == 65, result.stderr
    lines = error_lines(result)
    assert len(lines) == 3 and all(line.startswith(f"error: validate: {want}")
                                   for line, want in zip(lines, said)), result.stderr
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime",
                      str(runtime_file(RUNTIME)), "--trainjob", str(job), "--print-jobset",
                      env=clean_env(KUBETUNE_LOG_FORMAT="json"))
    assert result.returncode == 65 and "apiVersion" not in result.stdout, result.stderr
    messages = [json.loads(line)["message"] for line in result.stderr.splitlines()]
    assert len(messages) == 3 and all(m.startswith(f"local: {want}")
                                      for m, want in zip(messages, said)), result.stderr
    assert not (tmp_path / "run").exists()


def test_past_twenty_violations_the_rest_are_counted(capsys, monkeypatch, tmp_path):
    from kubetune.tools.local.violations import ContractError, report

    monkeypatch.setenv("KUBETUNE_TERMINATION_LOG", str(tmp_path / "termination-log"))
    assert report(ContractError([f"f: spec.x[{i:02}]: bad" for i in range(23)]), "validate") \
        == 65
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 21 and lines[0] == "error: validate: f: spec.x[00]: bad"
    assert lines[-1].startswith("error: validate: 3 more violations not shown (23 in all)")


def test_a_runtime_with_a_typo_is_refused(tmp_path):
    runtime = yaml.safe_load(runtime_file(RUNTIME).read_text())
    bad = copy.deepcopy(runtime)
    bad["spec"]["mlPolicy"]["numNode"] = 1
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(BadInputError) as err:
        load_runtime(path)
    assert str(err.value).startswith(
        f"{path}: spec.mlPolicy.numNode: unknown field (did you mean "
        "numNodes?)"), err.value
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]
    pod["initContainers" if "initContainers" in pod else "containers"][0]["env"] = [
        {"name": "X", "value": 2}]
    path.write_text(yaml.safe_dump(runtime))
    with pytest.raises(BadInputError, match=r"\.env\[0\]\.value: expected a string"):
        load_runtime(path)


def test_kubetune_local_refuses_before_anything_runs(tmp_path):
    job = _job(tmp_path, TYPOS[0][0])
    workdir = tmp_path / "run"
    result = kubetune("local", "--workdir", str(workdir), "--runtime",
                      str(runtime_file(RUNTIME)), "--trainjob", str(job), env=clean_env(
                          KUBETUNE_TERMINATION_LOG=str(tmp_path / "term")))
    assert result.returncode == 65, result.stderr
    assert "Traceback" not in result.stderr
    assert error_lines(result) == [
        f"error: local: {job}: spec.initializer.dataset.storageURI: unknown field (did you "
        "mean storageUri?); kubectl apply refuses this TrainJob too"], result.stderr
    assert not (workdir / "workspace").exists() and not (workdir / "sources").exists()


def test_what_we_ship_and_the_sdk_writes_passes(tmp_path):
    checked = 0
    for path in [*runtime_files(), *Path("examples").rglob("*.yaml")]:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in crd_schema_gen.CRD_FILES:
                assert manifest_schema.problems(doc) == [], path
                checked += 1
    assert checked >= 15
    for runtime in ("torchtune-llama3.2-1b", RUNTIME):
        for peft in ({"lora_rank": 8, "lora_alpha": 16}, None):
            spec = sdk_trainjob_spec(runtime_file(runtime), peft=peft,
                                     dataset_preprocess_config=None)
            load_trainjob(write_trainjob(tmp_path / "sdk.yaml", runtime, spec))
            assert not CRDS.is_dir() or validate(yaml.safe_load(
                (tmp_path / "sdk.yaml").read_text())) == []


@pytest.mark.skipif(not CRDS.is_dir(), reason="the CRDs (../shared/crds) are not here")
def test_the_shipped_schemas_are_the_crds():
    """After a CRD update: python -m kubetune.tools.local.crd_schema_gen ../shared/crds"""
    assert crd_schema_gen.SCHEMA_FILE.read_text() == crd_schema_gen.render(CRDS)
