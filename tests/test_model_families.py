"""Qwen3, Gemma 2 and Phi-3/Phi-4 checkpoints written by transformers itself: they load in
the trainer with transformers' logits, train, and export an adapter that PEFT applies
to the base to give the exported merged model.

transformers and peft run in the serving venv (tests/test_export_serving.py explains
why); the trainer and the exporter run as `kubetune` processes, as in a pod.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support import shared_runs, tiny_tokenizers
from tests.support.cli import REPO, clean_env, kubetune
from tests.test_export_serving import TOLERANCE, serving_python  # noqa: F401 (fixture)

HF_CHECKPOINT = REPO / "tests/support/hf_checkpoint.py"
VOCAB = 320  # the model's embedding rows; each tokenizer uses the first ones


@dataclass(frozen=True)
class Family:
    hf_family: str  # tests/support/hf_checkpoint.py FAMILIES key
    tokenizer: str  # "bpe" or "spm"
    special: tuple[str, ...]
    lora_component: str
    checkpointer: str
    targets: str  # --lora-target-modules
    # transformers loads byte-level BPE from tokenizer.json; a sentencepiece-only
    # checkpoint needs the sentencepiece package, which the serving venv lacks.
    token_ids: bool = False
    method: str = "lora"


FAMILIES = {
    "qwen3": Family("qwen3", "bpe", tiny_tokenizers.QWEN3_SPECIAL,
                    "kubetune.trainer.models.decoder.lora_decoder",
                    "kubetune.trainer.models.decoder_weights.DecoderHFCheckpointer", "all-linear"),
    "gemma2": Family("gemma2", "spm", (), "kubetune.trainer.models.decoder.lora_decoder",
                     "kubetune.trainer.models.decoder_weights.DecoderHFCheckpointer", "all-linear",
                     token_ids=True),
    # Phi-4's tokenizer files; DoRA on a subset of each fused module's parts, so the
    # fused PEFT adapter has zero blocks and base-norm magnitudes where a part has none.
    "phi4": Family("phi3", "bpe", tiny_tokenizers.PHI4_SPECIAL,
                   "torchtune.models.phi3.lora_phi3",
                   "kubetune.trainer.models.phi3_weights.Phi3HFCheckpointer",
                   "q_proj,v_proj,gate_proj,down_proj", method="dora"),
    # Phi-3's own tokenizer files (sentencepiece), LoRA on every linear.
    "phi3": Family("phi3", "spm", tiny_tokenizers.PHI3_SPECIAL,
                   "torchtune.models.phi3.lora_phi3",
                   "kubetune.trainer.models.phi3_weights.Phi3HFCheckpointer", "all-linear",
                   token_ids=True),
}
TRAIN = ["--epochs", "1", "--batch-size", "8", "--learning-rate", "3e-3", "--dtype", "fp32",
         "--seed", "0"]
LORA_STEPS = ["--max-steps", "3", "--warmup-steps", "1"]


def serving(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=600,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                               "HOME": "/tmp"})


# One written checkpoint per family and serving venv for the whole session: writing one
# starts transformers in another interpreter (seconds each, a dozen times over the suite).
# Each caller gets its own copy, so no test sees what another changed.
_WRITTEN: dict[tuple[str, str], Path] = {}


def write_checkpoint(python: Path, name: str, dest: Path) -> Path:
    key = (str(python), name)
    if key not in _WRITTEN:
        if (factory := shared_runs.session_factory()) is not None:
            # Once for both xdist workers: three files on either write the same families.
            venv = hashlib.sha256(str(python).encode()).hexdigest()[:12]
            _WRITTEN[key] = shared_runs.shared_run(
                factory, f"checkpoint-{name}-{venv}",
                lambda root: _write_checkpoint(python, name, root / "model")) / "model"
        else:
            pristine = Path(tempfile.mkdtemp(prefix=f"kubetune-checkpoint-{name}-"))
            atexit.register(shutil.rmtree, pristine, ignore_errors=True)
            _write_checkpoint(python, name, pristine / "model")
            _WRITTEN[key] = pristine / "model"
    shutil.copytree(_WRITTEN[key], dest, dirs_exist_ok=True)
    return dest


def _write_checkpoint(python: Path, name: str, dest: Path) -> None:
    family = FAMILIES[name]
    written = serving(python, str(HF_CHECKPOINT), "write", family.hf_family, str(dest),
                      str(VOCAB))
    assert written.returncode == 0, written.stderr[-3000:]
    if family.tokenizer == "bpe":
        tiny_tokenizers.write_bpe(dest, family.special)
    else:
        tiny_tokenizers.write_spm(dest, family.special)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request, serving_python, tmp_path_factory) -> tuple[str, Path]:
    name = request.param
    return name, write_checkpoint(serving_python, name, tmp_path_factory.mktemp(name) / "model")


def hf_logits(python: Path, model_dir: Path, tokens: list[list[int]], tmp: Path):
    import torch

    (tmp / "tokens.json").write_text(json.dumps(tokens))
    result = serving(python, str(HF_CHECKPOINT), "logits", str(model_dir), str(tmp / "tokens.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.tensor(json.loads(result.stdout))


# transformers' logits of each family's written checkpoint, before any training: both
# tests below compare with them, and each takes a serving-venv process to compute.
_BASE_LOGITS: dict[tuple[str, str], object] = {}


def base_hf_logits(python: Path, name: str, model_dir: Path, tmp: Path):
    """hf_logits of ``model_dir``, a copy of write_checkpoint's ``name``, computed once."""
    key = (str(python), name)
    if key not in _BASE_LOGITS:
        _BASE_LOGITS[key] = hf_logits(python, model_dir, tokens(), tmp)
    return _BASE_LOGITS[key]


def tokens() -> list[list[int]]:
    import torch

    return torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1)).tolist()


def train(model_dir: Path, dataset_dir: Path, output: Path, *args: str
          ) -> subprocess.CompletedProcess:
    env = clean_env(KUBETUNE_MODEL_DIR=str(model_dir), KUBETUNE_DATASET_DIR=str(dataset_dir),
                    KUBETUNE_OUTPUT_DIR=str(output))
    return kubetune("train", *TRAIN, *args, env=env, timeout=900)


def lora_run_through_the_runtime(model_dir: Path, dataset_dir: Path, tmp_path: Path
                                 ) -> tuple[Path, Path, Path]:
    """`kubetune local --runtime` of the direct Qwen3-8B LoRA runtime on the tiny Qwen3;
    returns the workspace's model, output and export (EXPORT_FORMAT=both) directories."""
    from tests.support.runtimes import runtime_file
    from tests.test_local_runtime import sources, trainjob

    env = {"KUBETUNE_MAX_STEPS": "3", "KUBETUNE_EPOCHS": "1", "KUBETUNE_BATCH_SIZE": "8",
           "KUBETUNE_LEARNING_RATE": "3e-3", "KUBETUNE_WARMUP_STEPS": "1",
           "KUBETUNE_DTYPE": "fp32", "KUBETUNE_SEED": "0",
           "KUBETUNE_LORA_TARGET_MODULES": "all-linear"}
    job = trainjob(tmp_path, "kubetune-qwen3-8b-lora", {
        **sources(model_dir, dataset_dir),
        "trainer": {"env": [{"name": k, "value": v} for k, v in env.items()]}})
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime",
                      str(runtime_file("kubetune-qwen3-8b-lora")), "--trainjob", str(job),
                      env=clean_env(EXPORT_FORMAT="both"), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ws = tmp_path / "run" / "workspace"
    assert json.loads((ws / "output" / "summary.json").read_text())["steps"] == 3
    merged = yaml.safe_load((ws / "output" / "kubetune-config.yaml").read_text())
    assert merged["model"]["_component_"] == "kubetune.trainer.models.decoder.lora_decoder"
    assert merged["checkpointer"]["_component_"] == FAMILIES["qwen3"].checkpointer
    # The runtime's exporter, with the variable the steps inherit as pods their image's.
    assert (ws / "export" / "adapter" / "adapter_model.safetensors").is_file()
    return ws / "model", ws / "output", ws / "export"


@pytest.mark.slow
# The family run's TrainJob is built by the kubeflow SDK, whose import warns.
@pytest.mark.filterwarnings("ignore:Support for class-based `config`")
def test_checkpoint_loads_with_transformers_logits_then_lora_trains_and_exports(
        checkpoint, serving_python, tiny_dataset_dir, tmp_path, tmp_path_factory):
    from tests.support.torchtune_logits import logits

    name, model_dir = checkpoint
    family = FAMILIES[name]

    # Loaded as the trainer loads it (builder + checkpointer from config.json), fp32.
    want = base_hf_logits(serving_python, name, model_dir, tmp_path)
    got = logits(model_dir, tokens())
    scale = max(1.0, float(want.abs().max()))
    assert float((got - want).abs().max()) <= TOLERANCE * scale

    if name == "qwen3":  # through its ClusterTrainingRuntime, as a TrainJob runs it
        model_dir, output, export = lora_run_through_the_runtime(model_dir, tiny_dataset_dir,
                                                                 tmp_path)
    elif (family.method, family.targets) == ("lora", "all-linear"):
        # The same LoRA (every linear layer, 3 steps at 3e-3) as tests/test_sdk_any_model.py's
        # TrainJob of this family, which checks its config: that run (on chat data, in the
        # checkpoint's chat template), trained once a session and exported as both.
        from tests.test_sdk_any_model import family_run

        run = family_run(name, serving_python, tmp_path_factory)
        model_dir, output, export = run.workspace / "model", run.workspace / "output", run.export
    else:
        output = tmp_path / "output"
        trained = train(model_dir, tiny_dataset_dir, output, *LORA_STEPS, "--method",
                        family.method, "--lora-target-modules", family.targets)
        assert trained.returncode == 0, trained.stderr[-3000:]
        export = tmp_path / "export"
        exported = kubetune("export", "--model-dir", str(model_dir), "--output-dir",
                            str(output), "--export-uri", str(export), "--export-format",
                            "both", env=clean_env())
        assert exported.returncode == 0, exported.stderr[-3000:]
    # The builder and checkpointer resolved from config.json, as the dry run shows.
    merged = yaml.safe_load((output / "kubetune-config.yaml").read_text())
    assert merged["model"]["_component_"] == family.lora_component
    assert merged["checkpointer"]["_component_"] == family.checkpointer
    served = serving(serving_python, str(REPO / "tests/support/serve_adapter.py"), str(export),
                     *(["--token-ids"] if family.token_ids else []))
    assert served.returncode == 0, served.stderr[-3000:]
    report = json.loads(served.stdout.strip().splitlines()[-1])
    print(f"{name}: peft vs merged: {report}")
    assert report["max_abs_diff"] <= TOLERANCE * max(1.0, report["logit_scale"])
    assert report["adapter_effect"] > 100 * TOLERANCE
    config = json.loads((export / "adapter" / "adapter_config.json").read_text())
    assert config.get("use_dora", False) is (family.method == "dora")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_full_finetune_saves_what_transformers_loads(name, serving_python, tiny_dataset_dir,
                                                     tmp_path):
    from tests.support.torchtune_logits import logits

    model_dir = write_checkpoint(serving_python, name, tmp_path / "model")
    output = tmp_path / "output"
    trained = train(model_dir, tiny_dataset_dir, output, "--method", "full", "--max-steps", "2")
    assert trained.returncode == 0, trained.stderr[-3000:]
    saved = output / "epoch_0"
    assert not (saved / "adapter_model.safetensors").exists()
    # The saved checkpoint is HF layout: transformers loads it and agrees with the trainer.
    want = hf_logits(serving_python, saved, tokens(), tmp_path)
    assert float((logits(saved, tokens()) - want).abs().max()) <= TOLERANCE * max(
        1.0, float(want.abs().max()))
    before = base_hf_logits(serving_python, name, model_dir, tmp_path)
    assert float((want - before).abs().max()) > 100 * TOLERANCE  # training moved it


def test_qwen2_adapter_is_saved_in_hf_rows(tmp_path):
    """torchtune 0.6.1 permutes q/k LoRA B as if Qwen's RoPE were interleaved; the adapter
    the Qwen checkpointer saves, applied to the base, gives the merged model it saves."""
    import torch
    from torchtune import training
    from torchtune.config._utils import _get_component_from_path
    from torchtune.modules.peft import get_adapter_state_dict, get_merged_lora_ckpt

    from kubetune.exporter import verify_logits
    from kubetune.tools.demo import write_tiny_qwen2
    from kubetune.trainer.checkpointing.checkpoint_model import read_checkpoint_model

    model_dir = write_tiny_qwen2(tmp_path / "model")
    checkpoint = read_checkpoint_model(model_dir)
    arch = checkpoint.architecture
    model = _get_component_from_path(arch.component(lora=True))(
        lora_attn_modules=["q_proj", "k_proj", "v_proj"], lora_rank=4, lora_alpha=8,
        **arch.dims)
    checkpointer = _get_component_from_path(arch.checkpointer)(
        checkpoint_dir=str(model_dir), checkpoint_files=checkpoint.weight_files,
        model_type=arch.model_type, output_dir=str(tmp_path / "out"))
    model.load_state_dict(checkpointer.load_checkpoint()[training.MODEL_KEY], strict=False)
    torch.manual_seed(0)
    with torch.no_grad():  # a trained adapter: B no longer zero
        for name, param in model.named_parameters():
            if "lora_b" in name:
                param.normal_(std=0.05)
    adapter = {k: v.clone() for k, v in get_adapter_state_dict(model.state_dict()).items()}
    merged = get_merged_lora_ckpt({k: v.clone() for k, v in model.state_dict().items()},
                                  rank=4, alpha=8)
    checkpointer.save_checkpoint({
        training.MODEL_KEY: merged, training.ADAPTER_KEY: adapter,
        training.ADAPTER_CONFIG: {"r": 4, "lora_alpha": 8, "peft_type": "LORA",
                                  "target_modules": ["q_proj", "k_proj", "v_proj"]}}, epoch=0)
    saved = tmp_path / "out" / "epoch_0"
    config = json.loads((saved / "adapter_config.json").read_text())
    report = verify_logits.check(model_dir / "config.json", [model_dir / "model.safetensors"],
                                 saved / "adapter_model.safetensors", config,
                                 sorted(saved.glob("model-*.safetensors")))
    assert report.max_abs_diff <= TOLERANCE * report.scale
