"""Any model through the Kubeflow SDK (kubeflow 0.5.0): the supported path is
`CustomTrainerContainer` against `kubetune-byo-model`, the model named by the model
initializer and built from its checkpoint's config.json (docs/runtimes.md "Any model from the
SDK"). Shown for Qwen3, Gemma 2, Phi-3 and Phi-4 on tiny checkpoints written by
transformers: the SDK builds the TrainJob, the controller's admission rules (admission_rules)
admit it, `kubetune local` runs it end to end, and PEFT loads the exported adapter onto the
base model.

Each family's run is the suite's family run (``family_run``): trained once a session on
chat data in the checkpoint's own chat template, and read by tests/test_model_families.py
(its export served by PEFT) and tests/test_chat_template_training.py (the template it
trained in) too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kubetune.tools.local.runtime_merge import merge
from tests.support.chat_data import write_chat_dataset
from tests.support.cli import REPO, clean_env, kubetune
from tests.support.runtimes import runtime_file
from tests.support.sdk_trainjob import sdk_container_trainjob_spec, sdk_runtime
from tests.support.shared_runs import shared_run
from tests.test_chat_template_families import write_tokenizer_dir
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)
from tests.test_model_families import FAMILIES, serving, write_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")

RUNTIME = runtime_file("kubetune-byo-model")
STEPS = 3
# What docs/runtimes.md tells a user to pass; the model's own size decides resources.
ENV = {"KUBETUNE_METHOD": "lora", "KUBETUNE_EPOCHS": "1", "KUBETUNE_LORA_RANK": "8",
       "KUBETUNE_LORA_ALPHA": "16", "KUBETUNE_LORA_TARGET_MODULES": "all-linear"}
RESOURCES = {"gpu": 1, "cpu": 8, "memory": "32Gi"}


def trainjob(spec: dict, runtime: str = "kubetune-byo-model") -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "sdk-any-model"},
            "spec": {"runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime"},
                     **spec}}


def test_sdk_takes_the_byo_runtime_as_a_custom_trainer_only():
    from kubeflow.trainer import BuiltinTrainer, TorchTuneConfig
    from kubeflow.trainer.backends.kubernetes.backend import KubernetesBackend
    from kubeflow.trainer.types.types import TrainerType

    runtime = sdk_runtime(RUNTIME)
    assert runtime.trainer.trainer_type == TrainerType.CUSTOM_TRAINER
    with pytest.raises(ValueError, match="BuiltinTrainer can't be used"):
        KubernetesBackend._get_trainjob_spec(None, runtime=runtime,
                                             trainer=BuiltinTrainer(config=TorchTuneConfig()))


@pytest.mark.parametrize("family", ["qwen3", "gemma2", "phi3", "phi4"])
def test_documented_sdk_trainjob_is_admitted(family):
    """The controller's admission rules, as ported in runtime_merge, admit the TrainJob
    docs/runtimes.md's snippet makes the SDK send (hub URIs as a user writes them)."""
    spec = sdk_container_trainjob_spec(RUNTIME, f"hf://org/tiny-{family}",
                                       "hf://org/tiny-data", ENV, RESOURCES)
    jobset = merge(yaml.safe_load(RUNTIME.read_text()), trainjob(spec))
    node = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == "node")
    container = node["template"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KUBETUNE_METHOD"] == "lora" and env["PET_NPROC_PER_NODE"] == "auto"
    assert container["resources"]["limits"]["memory"] == "32Gi"
    assert container["command"] == ["kubetune", "train"]  # the runtime's, kept


# The run's settings beside the documented ENV: 3 steps of one conversation each (the chat
# data has 16; Gemma's template, which refuses system turns, keeps 4), fp32.
RUN_ENV = {**ENV, "KUBETUNE_MAX_STEPS": str(STEPS), "KUBETUNE_BATCH_SIZE": "1",
           "KUBETUNE_GRADIENT_ACCUMULATION_STEPS": "1",
           "KUBETUNE_LEARNING_RATE": "3e-3", "KUBETUNE_WARMUP_STEPS": "1",
           "KUBETUNE_DTYPE": "fp32", "KUBETUNE_SEED": "0"}
FAMILY_RUNS = ("gemma2", "phi3", "phi4", "qwen3")


@dataclass(frozen=True)
class FamilyRun:
    family: str
    workdir: Path  # kubetune local's --workdir
    output: str  # its stdout and stderr

    @property
    def workspace(self) -> Path:
        return self.workdir / "workspace"

    @property
    def export(self) -> Path:
        """The runtime's exporter's EXPORT_FORMAT=both export: adapter/ and merged/."""
        return self.workspace / "export"


def family_run(family: str, python: Path, tmp_path_factory) -> FamilyRun:
    """The documented SDK TrainJob's `kubetune local` run on ``family``'s tiny
    checkpoint (write_checkpoint's, with its instruct model's chat template), on chat data
    with system prompts and several turns, exported as adapter and merged model; trained
    once a session and read by three files (the module's docstring)."""

    def build(root: Path) -> None:
        model_dir = write_tokenizer_dir(family, write_checkpoint(python, family,
                                                                 root / "model-src"))
        spec = sdk_container_trainjob_spec(RUNTIME, f"hf://org/tiny-{family}",
                                           "hf://org/tiny-data", RUN_ENV, RESOURCES)
        # The SDK builds hub sources only; the same TrainJob with local copies of them.
        spec["initializer"]["model"]["storageUri"] = f"file://{model_dir}"
        spec["initializer"]["dataset"]["storageUri"] = \
            f"file://{write_chat_dataset(root / 'data')}"
        job = root / "job.yaml"
        job.write_text(yaml.safe_dump(trainjob(spec)))
        # The steps inherit this environment as pods their image's: the exporter writes
        # the adapter and the merged model, checked against each other, in one process.
        result = kubetune("local", "--workdir", str(root / "run"), "--runtime", str(RUNTIME),
                          "--trainjob", str(job), env=clean_env(EXPORT_FORMAT="both"),
                          timeout=900)
        (root / "output.txt").write_text(result.stdout + result.stderr)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    root = shared_run(tmp_path_factory, f"family-{family}", build)
    return FamilyRun(family, root / "run", (root / "output.txt").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILY_RUNS)
def test_sdk_trainjob_trains_and_exports_the_model_it_names(family, serving_python,  # noqa: F811
                                                            tmp_path_factory):
    run = family_run(family, serving_python, tmp_path_factory)
    ws = run.workspace
    assert json.loads((ws / "output" / "summary.json").read_text())["steps"] == STEPS
    merged = yaml.safe_load((ws / "output" / "kubetune-config.yaml").read_text())
    assert merged["model"]["_component_"] == FAMILIES[family].lora_component
    assert merged["checkpointer"]["_component_"] == FAMILIES[family].checkpointer
    assert merged["model"]["lora_rank"] == 8
    adapter = json.loads((run.export / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8
    # Loadable as a user loads it: PEFT onto the base, every exported tensor taken.
    loaded = serving(serving_python, str(REPO / "tests/support/load_adapter.py"),
                     str(ws / "model"), str(run.export / "adapter"))
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    report = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert report["equal"] == report["tensors"] > 0, report
    assert not report["missing"] and not report["unexpected"], report
    assert report["finite"] and report["adapter_effect"] > 0, report


@pytest.mark.slow
def test_a_dropin_runtime_trains_the_phi3_checkpoint_it_is_given(serving_python,  # noqa: F811
                                                                 tiny_dataset_dir, tmp_path):
    """Not the documented path, but one a BuiltinTrainer user can take: a `torchtune-*`
    name upstream's webhook admits, with a Phi-3 checkpoint from the model initializer.
    The runtime's Llama defaults (builder, original/tokenizer.model, LLAMA3_2) yield to
    the checkpoint's, each in a line, and the export loads onto the Phi-3 base."""
    from tests.support.sdk_trainjob import sdk_trainjob_spec, use_local_sources

    dropin = runtime_file("torchtune-llama3.2-1b")
    model_dir = write_checkpoint(serving_python, "phi3", tmp_path / "model")
    spec = use_local_sources(sdk_trainjob_spec(dropin), model_dir, tiny_dataset_dir)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(trainjob(spec, "torchtune-llama3.2-1b")))
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime", str(dropin),
                      "--trainjob", str(job), env=clean_env(), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert "the checkpoint's config.json is phi3" in out
    assert "original/tokenizer.model does not fit a phi3 checkpoint" in out
    ws = tmp_path / "run" / "workspace"
    merged = yaml.safe_load((ws / "output" / "kubetune-config.yaml").read_text())
    assert merged["model"]["_component_"] == FAMILIES["phi3"].lora_component
    assert merged["checkpointer"]["model_type"] == "PHI3_MINI"
    assert merged["tokenizer"]["path"] == str(ws / "model" / "tokenizer.model")
    loaded = serving(serving_python, str(REPO / "tests/support/load_adapter.py"),
                     str(ws / "model"), str(ws / "export"))
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    report = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert report["equal"] == report["tensors"] > 0 and not report["unexpected"], report
    assert report["finite"] and report["adapter_effect"] > 0, report
