"""The model in the checkpoint wins over the model a runtime was written for (issue 23
part 2): each runtime a TrainJob can name (the drop-in `torchtune-*` names upstream's
webhook admits, with the SDK's BuiltinTrainer spec; `kubetune-byo-model` with the SDK's
CustomTrainerContainer spec) x each checkpoint family (written by transformers), as the
trainer container of the merged JobSet plans it (`--kubetune-dry-run` / `--dry-run`):
the builder, tokenizer, checkpointer and its model_type, and the LoRA modules trained.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.runtimes import runtime_file
from tests.support.sdk_trainjob import sdk_container_trainjob_spec, sdk_trainjob_spec
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)
from tests.test_model_families import write_checkpoint
from tests.test_trainer_config_checks import RECIPE, _dry_run_trainer

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")

# checkpoint -> (builder, tokenizer builder, checkpointer, checkpointer model_type)
EFFECTIVE = {
    "qwen3": ("kubetune.trainer.models.decoder.lora_decoder",
              "torchtune.models.qwen2_5.qwen2_5_tokenizer",
              "kubetune.trainer.models.decoder_weights.DecoderHFCheckpointer", "CONFIG_DECODER"),
    "gemma2": ("kubetune.trainer.models.decoder.lora_decoder",
               "torchtune.models.gemma.gemma_tokenizer",
               "kubetune.trainer.models.decoder_weights.DecoderHFCheckpointer", "CONFIG_DECODER"),
    "phi3": ("torchtune.models.phi3.lora_phi3", "torchtune.models.phi3.phi3_mini_tokenizer",
             "kubetune.trainer.models.phi3_weights.Phi3HFCheckpointer", "PHI3_MINI"),
    "phi4": ("torchtune.models.phi3.lora_phi3", "torchtune.models.phi4.phi4_tokenizer",
             "kubetune.trainer.models.phi3_weights.Phi3HFCheckpointer", "PHI3_MINI"),
}
# The tokenizer file each checkpoint's tokenizer reads (path / phi4's vocab_path).
TOKENIZER_FILE = {"qwen3": "vocab.json", "gemma2": "tokenizer.model",
                  "phi3": "tokenizer.model", "phi4": "vocab.json"}
DROPIN = ["torchtune-llama3.2-1b", "torchtune-llama3.2-3b", "torchtune-llama3.3-70b",
          "torchtune-qwen2.5-1.5b"]
# kubetune-byo-model as the README's CustomTrainerContainer snippet fills it.
BYO_ENV = {"KUBETUNE_METHOD": "lora", "KUBETUNE_LORA_TARGET_MODULES": "all-linear"}
ALL_ATTENTION = ["q_proj", "k_proj", "v_proj", "output_proj"]
FLAGGED = re.compile(r"unknown key|warning: key|error:")


@pytest.fixture(scope="module")
def checkpoints(serving_python, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: write_checkpoint(serving_python, name, root / name) for name in EFFECTIVE}


def _spec(runtime: str, env: dict[str, str] = BYO_ENV) -> dict:
    if runtime.startswith("torchtune-"):
        return sdk_trainjob_spec(runtime_file(runtime))  # LoRA on q_proj, v_proj
    return sdk_container_trainjob_spec(runtime_file(runtime), "hf://org/model", "hf://org/data",
                                       env, {"gpu": 1})


def _plan(runtime: str, model: Path, dataset: Path, tmp_path: Path,
          env: dict[str, str] = BYO_ENV):
    result = _dry_run_trainer(f"{runtime}.yaml", _spec(runtime, env), model, dataset, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    config = yaml.safe_load(result.stdout.split("\nconfig:\n", 1)[1].split("\ncommand:", 1)[0])
    return result, config


@pytest.mark.parametrize("model", sorted(EFFECTIVE))
@pytest.mark.parametrize("runtime", [*DROPIN, "kubetune-byo-model"])
def test_the_checkpoint_decides_builder_tokenizer_checkpointer_and_lora_modules(
        runtime, model, checkpoints, tiny_dataset_dir, tmp_path):
    result, cfg = _plan(runtime, checkpoints[model], tiny_dataset_dir, tmp_path)
    builder, tokenizer, checkpointer, model_type = EFFECTIVE[model]
    assert cfg["model"]["_component_"] == builder
    assert cfg["tokenizer"]["_component_"] == tokenizer
    assert cfg["checkpointer"]["_component_"] == checkpointer
    assert cfg["checkpointer"]["model_type"] == model_type
    # The tokenizer file is the checkpoint's, wherever the runtime said Llama's or Qwen's is.
    path = cfg["tokenizer"].get("path") or cfg["tokenizer"]["vocab_path"]
    assert path == str(tmp_path / "workspace" / "model" / TOKENIZER_FILE[model])
    assert Path(path).is_file()
    if model == "phi4":  # Phi-4's byte-level BPE builder takes its own spelling
        assert cfg["tokenizer"]["merges_path"].endswith("/merges.txt")
        assert "merges_file" not in cfg["tokenizer"]
    if model != "qwen3":
        assert "merges_file" not in cfg["tokenizer"]

    lora = cfg["model"]
    if runtime.startswith("torchtune-"):  # the SDK's LoraConfig, as the user set it
        assert lora["lora_attn_modules"] == ["q_proj", "v_proj"] and lora["lora_rank"] == 8
        assert not lora.get("apply_lora_to_output")
    else:
        assert lora["lora_attn_modules"] == ALL_ATTENTION and lora["apply_lora_to_mlp"]
        # Gemma ties its output to the embeddings: its builder takes no output LoRA.
        assert lora.get("apply_lora_to_output") is (None if model == "gemma2" else True)
    # all-linear asked for an output LoRA: where the model cannot have one, a line says so.
    tied = "model.apply_lora_to_output: gemma2 ties its output to the embeddings"
    assert (tied in result.stdout) is (model == "gemma2" and runtime == "kubetune-byo-model")

    # One line says the runtime's model yielded to the checkpoint's, naming all four.
    said = [line for line in result.stdout.splitlines()
            if line.startswith("note: model: config ")]
    assert len(said) == 1, result.stdout
    assert all(part in said[0] for part in (builder, tokenizer, checkpointer, model_type))
    assert not FLAGGED.search(result.stdout + result.stderr), result.stderr


def test_all_linear_on_a_tied_llama_trains_every_linear_layer_but_the_output(
        tiny_dataset_dir, tmp_path):
    """Llama 3.2's output is its embedding: torchtune's builder refuses an output LoRA, so
    `all-linear` on kubetune-byo-model trains the others and one line says so (it was
    exit 70 from inside the recipe)."""
    from kubetune.tools.demo import TinyModelSpec, write_tiny_model

    model = write_tiny_model(tmp_path / "tied", TinyModelSpec(tie_word_embeddings=True))
    result, cfg = _plan("kubetune-byo-model", model, tiny_dataset_dir, tmp_path / "run")
    assert cfg["model"]["lora_attn_modules"] == ALL_ATTENTION and cfg["model"]["apply_lora_to_mlp"]
    assert "apply_lora_to_output" not in cfg["model"]
    assert "model.apply_lora_to_output: llama3_2 ties its output to the embeddings" \
        in result.stdout


def test_a_runtimes_tokenizer_file_for_another_family_is_replaced_in_one_line(
        checkpoints, tiny_dataset_dir, tmp_path):
    """The Qwen2.5 drop-in names vocab.json and merges.txt; a Phi-3 checkpoint's
    sentencepiece tokenizer reads tokenizer.model and no merges: one line for each."""
    result, cfg = _plan("torchtune-qwen2.5-1.5b", checkpoints["phi3"], tiny_dataset_dir,
                        tmp_path)
    model = tmp_path / "workspace" / "model"
    assert f"tokenizer.path {model}/vocab.json does not fit a phi3 checkpoint: using " \
           f"{model}/tokenizer.model" in result.stderr
    assert f"tokenizer.merges_file {model}/merges.txt: a phi3 checkpoint's tokenizer " \
           "(torchtune.models.phi3.phi3_mini_tokenizer) reads no merges file" in result.stderr
    assert set(cfg["tokenizer"]) == {"_component_", "path", "special_tokens_path", "max_seq_len"}


def test_a_users_own_tokenizer_file_of_the_right_kind_is_kept(checkpoints, tiny_dataset_dir,
                                                              tmp_path):
    """Only a path into the model directory that is not there is another layout's
    default: a tokenizer.model the user keeps elsewhere still wins."""
    from tests.support.trainer import make_pvc, tune_run

    pvc = make_pvc(tmp_path / "pvc", checkpoints["phi3"], tiny_dataset_dir)
    own = tmp_path / "own" / "tokenizer.model"
    own.parent.mkdir()
    shutil.copy(checkpoints["phi3"] / "tokenizer.model", own)
    result = tune_run(pvc, *RECIPE, f"output_dir={pvc.output}",
                      f"checkpointer.checkpoint_dir={pvc.model}", f"tokenizer.path={own}",
                      "--kubetune-dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"  path: {own}\n" in result.stdout


def test_phis_fused_module_names_train_their_parts(checkpoints, tiny_dataset_dir, tmp_path):
    """A PEFT config written for Phi-3 names its fused qkv_proj and gate_up_proj."""
    _, cfg = _plan("kubetune-byo-model", checkpoints["phi3"], tiny_dataset_dir, tmp_path,
                   {"KUBETUNE_LORA_TARGET_MODULES": "qkv_proj,gate_up_proj"})
    assert cfg["model"]["lora_attn_modules"] == ["q_proj", "k_proj", "v_proj"]
    assert cfg["model"]["apply_lora_to_mlp"] is True
    assert cfg["model"]["apply_lora_to_output"] is False


def _with_config(checkpoint: Path, dest: Path, **changes) -> Path:
    shutil.copytree(checkpoint, dest)
    config = json.loads((dest / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (dest / "config.json").write_text(json.dumps(config))
    return dest


@pytest.mark.parametrize("runtime", ["torchtune-llama3.2-1b", "kubetune-byo-model"])
def test_an_unknown_architecture_is_one_error_naming_it_and_the_supported(
        runtime, checkpoints, tiny_dataset_dir, tmp_path):
    model = _with_config(checkpoints["phi3"], tmp_path / "falcon", model_type="falcon",
                         architectures=["FalconForCausalLM"])
    result = _dry_run_trainer(f"{runtime}.yaml", _spec(runtime), model, tiny_dataset_dir,
                              tmp_path / "run")
    assert result.returncode == 65, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    # A phi3-shaped config named falcon: every feature is one the table knows, so only
    # the row is missing, and the line says where to add it.
    assert len(errors) == 1
    assert errors[0].startswith(
        "error: trainer: model_type 'falcon' in config.json is not supported: its features "
        "may all be known, but no family row names it; add one in "
        "kubetune/model_family/families.py (docs/extending.md#a-model-family-of-your-own); "
        "supported: gemma, gemma2, gemma3_text, granite, llama, ministral, mistral, olmo2, "), \
        errors[0]
    assert "Traceback" not in result.stderr


def test_a_config_without_model_type_is_read_by_its_architecture(checkpoints,
                                                                 tiny_dataset_dir, tmp_path):
    model = _with_config(checkpoints["phi3"], tmp_path / "phi3", model_type=None)
    assert json.loads((model / "config.json").read_text())["architectures"] == \
        ["Phi3ForCausalLM"]
    _, cfg = _plan("torchtune-llama3.2-1b", model, tiny_dataset_dir, tmp_path / "run")
    assert cfg["checkpointer"]["model_type"] == "PHI3_MINI"


# --- host memory: the runtime's limit against the checkpoint actually loaded -------------

# bf16 safetensors bytes of real checkpoints: 2 x their parameter counts
# (tests/test_trainer_defaults.py REAL_CONFIGS).
CHECKPOINT_BYTES = {"Llama-3.2-1B": 2 * 1_235_814_400, "Qwen3-8B": 2 * 8_190_735_360,
                    "phi-4": 2 * 14_659_507_200}


def _node_limits(runtime: str) -> tuple[int, int]:
    """(memory limit in bytes, GPUs: the processes `nproc_per_node: auto` starts) of the
    runtime's trainer container."""
    from kubetune.tools.local.runtime_spec import load_runtime

    spec = load_runtime(runtime_file(runtime))["spec"]["template"]["spec"]
    node = next(j for j in spec["replicatedJobs"] if j["name"] == "node")
    limits = node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["memory"].endswith("Gi")
    return int(limits["memory"][:-2]) * 2 ** 30, int(limits["nvidia.com/gpu"])


@pytest.mark.parametrize("runtime, checkpoint, warned", [
    ("torchtune-llama3.2-1b", "Llama-3.2-1B", False),  # what the runtime was sized for
    ("torchtune-llama3.2-1b", "Qwen3-8B", False),  # 2 x 16.4 GB within 80% of 64 GiB
    ("torchtune-llama3.2-1b", "phi-4", True),  # 2 x 29.3 GB: not
    ("kubetune-byo-model", "phi-4", False),  # one process
    ("torchtune-llama3.3-70b", "phi-4", False),
])
def test_a_checkpoint_too_large_for_the_runtimes_memory_is_one_note(runtime, checkpoint,
                                                                    warned):
    from kubetune.trainer.performance import host_memory

    limit, processes = _node_limits(runtime)
    line = host_memory.note(processes, CHECKPOINT_BYTES[checkpoint], limit)
    assert (line is not None) is warned
    if warned:
        assert line.startswith("memory: 2 process(es) on this node each load the whole "
                               "checkpoint (27.3 GiB) into host memory before the GPU: about "
                               "54.6 GiB against this container's 64.0 GiB limit")


def test_no_memory_limit_no_note(tmp_path):
    from kubetune.trainer.performance import host_memory

    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    assert host_memory.container_memory_bytes((v2, v1)) is None  # no cgroup files
    v1.write_text("9223372036854771712\n")  # v1's "unlimited"
    assert host_memory.container_memory_bytes((v2, v1)) is None
    v2.write_text("max\n")
    assert host_memory.container_memory_bytes((v2, v1)) is None
    v2.write_text(f"{64 * 2 ** 30}\n")
    assert host_memory.container_memory_bytes((v2, v1)) == 64 * 2 ** 30
    assert host_memory.note(8, 10 ** 12, None) is None
