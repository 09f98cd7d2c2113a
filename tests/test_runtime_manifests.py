"""The runtimes and example TrainJobs as a cluster would take them: valid against the
Kubeflow Trainer CRDs, lossless through the `kubeflow-trainer-api` models, and carrying
the policies every runtime promises (security, failure handling, sizing, exporter)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.crd_schema import CRDS, validate
from tests.support.runtimes import BASE, DROPIN, runtime_file, runtime_files

REPO = Path(__file__).resolve().parents[1]
RUNTIMES = runtime_files()
EXAMPLES = [*sorted((REPO / "examples" / "trainjobs").glob("*.yaml")),
            REPO / "examples" / "laptop" / "job.yaml"]
EXAMPLE_RUNTIMES = sorted((REPO / "examples").glob("*/runtime.yaml"))
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"

needs_crds = pytest.mark.skipif(not CRDS.is_dir(),
                                reason=f"Kubeflow Trainer CRDs not found at {CRDS} "
                                       "(../shared/crds beside the repository)")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def jobs(runtime: dict) -> list[dict]:
    return runtime["spec"]["template"]["spec"]["replicatedJobs"]


def pod(job: dict) -> dict:
    return job["template"]["spec"]["template"]["spec"]


def test_every_family_is_present():
    names = {load(p)["metadata"]["name"] for p in RUNTIMES}
    assert {"torchtune-llama3.2-1b", "torchtune-llama3.2-3b", "torchtune-qwen2.5-1.5b",
            "torchtune-llama3.3-70b", "kubetune-llama3.1-8b-lora", "kubetune-qwen2.5-7b-qlora",
            "kubetune-mistral-7b-lora", "kubetune-gemma-7b-lora", "kubetune-byo-model",
            "kubetune-llama3.1-8b-full-multinode"} <= names
    listed = [name for d in (BASE, DROPIN) for name in load(d / "kustomization.yaml")["resources"]]
    assert sorted(listed) == sorted(p.name for p in RUNTIMES)


def test_base_does_not_replace_upstream_runtimes():
    """`kubectl apply -k runtimes/base` must leave upstream's torchtune-* runtimes alone:
    the drop-ins (upstream's names) are only in the opt-in overlay."""
    base = load(BASE / "kustomization.yaml")["resources"]
    assert base and not [n for n in base if n.startswith("torchtune-")]
    assert all(n.startswith("torchtune-") for n in load(DROPIN / "kustomization.yaml")["resources"])
    assert "REPLACES upstream" in (DROPIN / "kustomization.yaml").read_text()


def test_generated_runtimes_are_up_to_date():
    sys.path.insert(0, str(REPO / "runtimes"))
    try:
        import generate
    finally:
        sys.path.pop(0)
    for name, doc in generate.documents().items():
        path = generate.directory(name) / name
        assert path == runtime_file(name)
        assert path.read_text() == generate.render(doc), \
            f"{path.relative_to(REPO)} is stale: run python runtimes/generate.py"


@needs_crds
@pytest.mark.parametrize("path", RUNTIMES + EXAMPLES + EXAMPLE_RUNTIMES,
                         ids=lambda p: str(p.relative_to(REPO)))
def test_manifest_validates_against_the_crd(path):
    assert validate(load(path)) == []


@needs_crds
def test_validator_rejects_what_the_api_server_rejects():
    runtime = load(RUNTIMES[0])
    pod(jobs(runtime)[0])["containers"][0]["enviroment"] = []  # misspelt: pruned by the server
    runtime["spec"]["template"]["spec"]["failurePolicy"]["rules"][0]["action"] = "Retry"
    runtime["spec"]["mlPolicy"]["mpi"] = {}
    errors = validate(runtime)
    assert any("'enviroment' was unexpected" in e for e in errors)
    assert any("'Retry' is not one of" in e for e in errors)
    assert any("Only one of the policy can be configured" in e for e in errors)
    job = load(EXAMPLES[0])
    job["metadata"]["name"] = "Not_A_DNS_Label"
    job["spec"]["initializer"]["model"]["storageUri"] = "/no/scheme"
    errors = validate(job)
    assert any("RFC 1035" in e for e in errors) and any("storageUri" in e for e in errors)


def _roundtrip(doc: dict) -> dict:
    from kubeflow_trainer_api.models import (TrainerV1alpha1ClusterTrainingRuntime,
                                             TrainerV1alpha1TrainJob)

    model = {"ClusterTrainingRuntime": TrainerV1alpha1ClusterTrainingRuntime,
             "TrainJob": TrainerV1alpha1TrainJob}[doc["kind"]]
    return model.from_dict(copy.deepcopy(doc)).to_dict()


@pytest.mark.parametrize("path", RUNTIMES + EXAMPLES + EXAMPLE_RUNTIMES,
                         ids=lambda p: str(p.relative_to(REPO)))
def test_manifest_roundtrips_through_the_api_models(path):
    doc = load(path)
    assert _roundtrip(doc) == doc


def test_roundtrip_comparison_sees_a_lost_field():
    doc = load(RUNTIMES[0])
    pod(jobs(doc)[0])["containers"][0]["notAField"] = True
    assert _roundtrip(doc) != doc


@pytest.mark.parametrize("path", RUNTIMES + EXAMPLE_RUNTIMES,
                         ids=lambda p: str(p.relative_to(REPO)))
def test_runtime_policies(path):
    runtime = load(path)
    spec = runtime["spec"]["template"]["spec"]
    claims = {t["metadata"]["name"] for p in spec["volumeClaimPolicies"] for t in p["templates"]}
    assert claims == {"initializer"}  # the name the controller's admission checks require
    rules = {r["action"]: r for r in spec["failurePolicy"]["rules"]}
    for rule in spec["failurePolicy"]["rules"]:
        # JobSet's webhook (not the Trainer CRD) holds rule names to this pattern.
        assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule["name"]), rule["name"]
    assert rules["FailJobSet"]["onJobFailureReasons"] == ["PodFailurePolicy"]
    assert rules["RestartJobSet"]["onJobFailureReasons"] == ["BackoffLimitExceeded"]
    assert spec["failurePolicy"]["maxRestarts"] >= 1
    seen = []
    for job in jobs(runtime):
        for dep in job.get("dependsOn") or []:
            assert dep["name"] in seen, f"{job['name']} depends on a later job"
        seen.append(job["name"])
        p = pod(job)
        assert p["restartPolicy"] == "Never"  # podFailurePolicy requires it
        assert p["securityContext"]["runAsNonRoot"] is True
        assert p["securityContext"]["runAsUser"] != 0
        volumes = {v["name"] for v in p.get("volumes") or []} | claims
        for c in p["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
            assert c["resources"]["limits"]["memory"]
            assert {m["name"] for m in c["volumeMounts"]} <= volumes
            assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}  # read-only root
            final = [r for r in job["template"]["spec"]["podFailurePolicy"]["rules"]
                     if r["action"] == "FailJob"]
            codes = {v for r in final for v in r["onExitCodes"]["values"]
                     if r["onExitCodes"].get("containerName") == c["name"]}
            for r in job["template"]["spec"]["podFailurePolicy"]["rules"]:
                values = (r.get("onExitCodes") or {}).get("values", [1])
                # The Job API wants them ascending, unique, and no 0 with In.
                assert values == sorted(set(values)) and 0 not in values
            assert 65 in codes and 75 not in codes
            # A recipe killed by a signal (76, e.g. the OOM killer) restarts and resumes.
            counted = {v for r in job["template"]["spec"]["podFailurePolicy"]["rules"]
                       if r["action"] == "Count" for v in r["onExitCodes"]["values"]}
            assert {75, 76} <= counted and 76 not in codes
    node_job = next(j for j in jobs(runtime) if j["name"] == "node")
    assert node_job["template"]["metadata"]["labels"][ANCESTOR] == "trainer"
    node = pod(node_job)["containers"][0]
    assert node["name"] == "node"
    assert node["resources"]["limits"]["nvidia.com/gpu"] >= 1
    shm = {m["name"] for m in node["volumeMounts"] if m["mountPath"] == "/dev/shm"}
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" and v["name"] in shm
               for v in pod(node_job)["volumes"])


@pytest.mark.parametrize("path", RUNTIMES, ids=lambda p: p.name)
def test_exporter_runs_last_with_its_destination_from_env(path):
    runtime = load(path)
    names = [j["name"] for j in jobs(runtime)]
    if runtime.get("spec", {}).get("podGroupPolicy"):
        # Gang-scheduled: one stage (see runtimes/generate.py); node 0 exports last.
        node = pod(jobs(runtime)[0])["containers"][0]
        assert names == ["node"] and "kubetune export" in node["command"][2]
        assert "EXPORT_URI" in {e["name"] for e in node["env"]}
        return
    # A distillation runtime's teacher is a third initializer, before the node.
    teacher = ["teacher-initializer"] if "teacher-initializer" in names else []
    assert names == ["dataset-initializer", "model-initializer", *teacher, "node", "exporter"]
    exporter = jobs(runtime)[-1]
    assert exporter["dependsOn"] == [{"name": "node", "status": "Complete"}]
    container = pod(exporter)["containers"][0]
    assert container["command"] == ["kubetune", "export"]
    assert {"name": "initializer", "mountPath": "/workspace"} in container["volumeMounts"]
    assert any(e["name"] == "EXPORT_URI" for e in container["env"])


def test_the_distillation_runtime_fetches_the_teacher_before_the_node():
    runtime = load(next(p for p in RUNTIMES if "distill" in p.name))
    by_name = {j["name"]: j for j in jobs(runtime)}
    teacher = pod(by_name["teacher-initializer"])["containers"][0]
    assert teacher["command"] == ["kubetune", "init-model"]
    env = {e["name"]: e["value"] for e in teacher["env"]}
    assert env["OUTPUT_PATH"] == "/workspace/teacher" and env["STORAGE_URI"].startswith("hf://")
    assert {"name": "teacher-initializer", "status": "Complete"} in by_name["node"]["dependsOn"]
    node_env = {e["name"]: e["value"] for e in pod(by_name["node"])["containers"][0]["env"]}
    assert node_env["KUBETUNE_OBJECTIVE"] == "distill"


@pytest.mark.parametrize("path", [p for p in RUNTIMES if p.name.startswith("torchtune-")],
                         ids=lambda p: p.name)
def test_dropin_runtime_has_the_shape_the_controller_and_sdk_expect(path):
    from kubetune.tools.local.admission_rules import SUPPORTED_TUNE_MODELS as TUNE_MODELS
    from kubetune.tools.local.runtime_merge import tune_model

    runtime = load(path)
    assert tune_model(runtime["metadata"]["name"]) in TUNE_MODELS
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torchtune"
    assert "torch" in runtime["spec"]["mlPolicy"]
    node_job = next(j for j in jobs(runtime) if j["name"] == "node")
    node = pod(node_job)["containers"][0]
    assert node["command"][:2] == ["tune", "run"]
    keys = {c.split("=", 1)[0] for c in node["command"]}
    assert {"output_dir", "tokenizer.path", "checkpointer.checkpoint_dir"} <= keys
    # The SDK reads the trainer from the first labelled job with a `node` container.
    first = next(j for j in jobs(runtime) if ANCESTOR in j["template"].get("metadata", {})
                 .get("labels", {}) and any(c["name"] == "node" for c in pod(j)["containers"]))
    assert first is node_job


def test_overlay_retargets_every_image():
    overlay = load(REPO / "runtimes" / "overlays" / "example" / "kustomization.yaml")
    assert overlay["resources"][0] == "../../base"
    mapped = {i["name"]: i for i in overlay["images"]}
    for path in RUNTIMES:
        for job in jobs(load(path)):
            for c in pod(job)["containers"]:
                name = c["image"].rsplit(":", 1)[0]
                assert name in mapped, f"{path.name}: {name} not retargeted by the overlay"
                assert mapped[name].get("newName") and mapped[name].get("newTag")


def test_print_jobset_shows_the_controller_merge(tmp_path):
    """A drop-in runtime, a `tune run` TrainJob on 70B over two nodes: the command the
    controller composes and the PET_* env, as `kubetune local --print-jobset` shows them."""
    job = REPO / "examples" / "trainjobs" / "llama3.2-1b-lora-sdk.yaml"
    doc = load(job)
    doc["spec"]["runtimeRef"]["name"] = "torchtune-llama3.3-70b"
    doc["spec"]["trainer"]["numNodes"] = 2
    doc["spec"]["trainer"]["args"] = ["epochs=1"]
    tmp = tmp_path / "trainjob.yaml"
    tmp.write_text(yaml.safe_dump(doc))
    result = subprocess.run(
        [sys.executable, "-m", "kubetune.entrypoints", "local", "--print-jobset", "--runtime",
         str(runtime_file("torchtune-llama3.3-70b")), "--trainjob",
         str(tmp)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    jobset = yaml.safe_load(result.stdout)
    node_job = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == "node")
    node = pod(node_job)["containers"][0]
    assert node["command"] == [
        "tune", "run", "--rdzv_endpoint=llama3-2-1b-lora-node-0-0.llama3-2-1b-lora:29500",
        "full_finetune_distributed", "--config", "llama3_3/70B_full_multinode",
        "output_dir=/workspace/output",
        "tokenizer.path=/workspace/model/original/tokenizer.model",
        "checkpointer.checkpoint_dir=/workspace/model"]
    assert node["args"] == ["epochs=1"]
    env = {e["name"]: e for e in node["env"]}
    assert env["PET_NNODES"]["value"] == "2" and env["PET_NPROC_PER_NODE"]["value"] == "auto"
    assert env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"].endswith(
        "job-completion-index']")
    assert node_job["template"]["spec"]["parallelism"] == 2
    model = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == "model-initializer")
    menv = {e["name"]: e.get("value") for e in pod(model)["containers"][0]["env"]}
    assert menv["STORAGE_URI"] == "hf://meta-llama/Llama-3.2-1B-Instruct"
    assert pod(model)["containers"][0]["envFrom"] == [{"secretRef": {"name": "hf-token"}}]


def test_print_jobset_masks_credentials(tmp_path):
    job = load(REPO / "examples" / "trainjobs" / "byo-model.yaml")
    job["spec"]["initializer"]["model"]["env"] = [{"name": "ACCESS_TOKEN",
                                                   "value": "tok-very-secret-1234"}]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    result = subprocess.run(
        [sys.executable, "-m", "kubetune.entrypoints", "local", "--print-jobset", "--runtime",
         str(runtime_file("kubetune-byo-model")), "--trainjob", str(path)],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "tok-very-secret-1234" not in result.stdout + result.stderr
    assert "name: ACCESS_TOKEN\n" in result.stdout and "value: '***'" in result.stdout
