"""Settings a torchtune config wrote for its own model, outside the model section, fitted
to the checkpoint trained (trainer/config/model_shaped.py): FSDP's separately sharded
layers, FSDP's CPU offload, tensor parallelism. Each change is one line; the same value
given as an override is the user's, and one this checkpoint cannot run is exit 65 before
launch. Shown on the plans (dry runs) of the runtimes and `tune run` commands that carry
these configs; tests/test_support_matrix.py trains them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from kubetune.tools.demo import TinyModelSpec, write_tiny_model
from tests.support.runtimes import initializer_uris, runtime_file
from tests.support.sdk_trainjob import sdk_trainjob_spec
from tests.support.trainer import SHORT, make_pvc, tune_run
from tests.test_trainer_config_checks import _dry_run_trainer

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")

SHARDED_NOTE = ("custom_sharded_layers: config {config} shards ['tok_embeddings', 'output'] "
                "on their own, for a model with an output weight of its own; this llama3_2 "
                "checkpoint ties its output to the embeddings, which stay with the rest of the "
                "model (none sharded apart)")


@pytest.fixture(scope="module")
def tied_llama(tmp_path_factory) -> Path:
    """The demo's Llama-3.2-shaped checkpoint: tied output, llama3 RoPE scaling."""
    return write_tiny_model(tmp_path_factory.mktemp("tied") / "model",
                            TinyModelSpec(tie_word_embeddings=True))


def _byo_full_on_two_nodes(model: Path, dataset: Path) -> dict:
    """A TrainJob's spec: kubetune-byo-model, method full, 2 nodes of 1 process."""
    return {**initializer_uris(f"file://{model}", f"file://{dataset}"),
            "trainer": {"numNodes": 2, "numProcPerNode": 1,
                        "env": [{"name": "KUBETUNE_METHOD", "value": "full"}]}}


def _sdk_full_on_two_gpus(runtime: str) -> dict:
    """The SDK's BuiltinTrainer full fine-tune on a drop-in, 2 processes on 2 GPUs."""
    spec = sdk_trainjob_spec(runtime_file(runtime), peft=None, gpus=2)
    spec["trainer"]["numProcPerNode"] = 2
    return spec


def _config(result) -> dict:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return yaml.safe_load(result.stdout.split("\nconfig:\n", 1)[1].split("\ncommand:", 1)[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tune_run_full_8b(tmp_path, model, dataset, *extra):
    """The issue's first report: 2 processes on the 8B full config (the gang runtime's)."""
    pvc = make_pvc(tmp_path / "pvc", model, dataset)
    return tune_run(pvc, "--nproc_per_node", "2", f"--rdzv_endpoint=127.0.0.1:{_free_port()}",
                    "full_finetune_distributed", "--config", "llama3_1/8B_full",
                    *pvc.runtime_args(), "dataset=torchtune.datasets.instruct_dataset",
                    f"dataset.data_dir={pvc.dataset / 'data'}", *SHORT, *extra,
                    "--kubetune-dry-run", env=pvc.env(PET_NNODES="1", PET_NPROC_PER_NODE="2"))


def test_tune_run_on_the_8b_full_config_keeps_a_tied_output_with_its_embeddings(
        tied_llama, tiny_dataset_dir, tmp_path):
    result = _tune_run_full_8b(tmp_path, tied_llama, tiny_dataset_dir)
    cfg = _config(result)
    assert cfg["custom_sharded_layers"] is None
    assert "collate_fn" not in cfg  # nothing is gathered per output chunk
    assert f"note: {SHARDED_NOTE.format(config='llama3_1/8B_full')}" in result.stdout


def test_an_untied_checkpoint_keeps_the_configs_sharding_with_whole_output_chunks(
        tiny_model_dir, tiny_dataset_dir, tmp_path):
    """The output sharded apart gathers its weight once per output chunk of the loss: every
    process pads its batches to a multiple of the 8 chunks (a 9-token batch chunks into 5,
    a 16-token one into 8, and the processes' collectives no longer pair up)."""
    result = _tune_run_full_8b(tmp_path, tiny_model_dir, tiny_dataset_dir)
    cfg = _config(result)
    assert cfg["custom_sharded_layers"] == ["tok_embeddings", "output"]
    assert cfg["collate_fn"] == \
        "kubetune.trainer.data.whole_chunks.padded_collate_sft_whole_chunks"
    notes = result.stdout.split("\nconfig:\n")[0]
    assert "custom_sharded_layers" not in notes
    assert "note: collate_fn: config llama3_1/8B_full shards the output apart, which gathers " \
           "its weight for each output chunk of the loss: batches are padded to a multiple " \
           "of 8 tokens, so every process splits its batch into as many chunks" in notes


def test_whole_chunk_batches_split_into_as_many_chunks_whatever_their_length():
    from kubetune.trainer.data.whole_chunks import padded_collate_sft_whole_chunks

    chunks = set()
    for longest in range(1, 40):
        batch = [{"tokens": [5] * n, "labels": [5] * n} for n in (1, longest)]
        collated = padded_collate_sft_whole_chunks(batch, padding_idx=0, ignore_idx=-100)
        assert collated["labels"][0, 1:].eq(-100).all()  # padding never counts in the loss
        assert collated["tokens"][1, :longest].eq(5).all()
        chunks.add(len(collated["tokens"].chunk(8, dim=1)))
    assert chunks == {8}


def test_byo_runtime_full_on_two_nodes_fits_the_multinode_config_to_a_tied_model(
        tied_llama, tiny_dataset_dir, tmp_path):
    """The issue's second report: kubetune-byo-model, numNodes 2, method full picks
    llama3_3/70B_full_multinode (node 0's plan)."""
    result = _dry_run_trainer("kubetune-byo-model.yaml",
                              _byo_full_on_two_nodes(tied_llama, tiny_dataset_dir), tied_llama,
                              tiny_dataset_dir, tmp_path)
    assert _config(result)["custom_sharded_layers"] is None
    assert SHARDED_NOTE.format(config="llama3_3/70B_full_multinode") in result.stdout


def test_sharding_the_embeddings_of_a_tied_model_on_request_is_refused(
        tied_llama, tiny_dataset_dir, tmp_path):
    result = _tune_run_full_8b(tmp_path, tied_llama, tiny_dataset_dir,
                               "custom_sharded_layers=[tok_embeddings]")
    assert result.returncode == 65, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: trainer: custom_sharded_layers=['tok_embeddings']: this llama3_2 "
                      "checkpoint ties its output to its embeddings, and FSDP cannot shard "
                      "tok_embeddings apart from the model that uses them both; leave them out "
                      "of custom_sharded_layers"]


def test_the_70b_drop_ins_cpu_offload_is_off_on_cpu(tiny_model_dir, tiny_dataset_dir,
                                                    tmp_path):
    """llama3_3/70B_full offloads FSDP's parameters to host memory: on CPU, where they
    already are, torch refuses the process group it asks for."""
    spec = _sdk_full_on_two_gpus("torchtune-llama3.3-70b")
    result = _dry_run_trainer("torchtune-llama3.3-70b.yaml", spec, tiny_model_dir,
                              tiny_dataset_dir, tmp_path)
    assert _config(result)["fsdp_cpu_offload"] is False
    assert "note: fsdp_cpu_offload: config llama3_3/70B_full offloads parameters to host " \
           "memory; this run trains on the CPU, where they already are: off" in result.stdout
    # Asked for by the user, it is refused instead.
    spec["trainer"]["args"].append("fsdp_cpu_offload=True")
    result = _dry_run_trainer("torchtune-llama3.3-70b.yaml", spec, tiny_model_dir,
                              tiny_dataset_dir, tmp_path / "asked")
    assert result.returncode == 65, result.stderr[-2000:]
    assert "error: trainer: fsdp_cpu_offload=True offloads parameters from the GPU to host " \
           "memory, and this run trains on the CPU: leave it out" in result.stderr


# The sizes of real checkpoints (config.json), for the GPU rule.
LLAMA_3_2_1B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
                "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                "num_key_value_heads": 8, "tie_word_embeddings": True,
                "rope_scaling": {"rope_type": "llama3", "factor": 32.0}}
LLAMA_3_3_70B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 8192,
                 "intermediate_size": 28672, "num_hidden_layers": 80,
                 "num_attention_heads": 64, "num_key_value_heads": 8,
                 "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
H100 = 80 * 10 ** 9


@pytest.mark.parametrize("config, gpus, offloaded", [
    (LLAMA_3_2_1B, 8, False),  # 1.2B: weights, gradients and AdamW fit each GPU many times
    (LLAMA_3_3_70B, 8, True),  # what the config was written for: ~140 GB of state per GPU
    (LLAMA_3_3_70B, 64, False),  # 8 nodes of 8: ~18 GB per GPU
])
def test_on_gpus_offload_stays_only_where_the_sharded_state_does_not_fit(config, gpus,
                                                                         offloaded):
    from kubetune.model_family.architecture import architecture_of
    from kubetune.trainer.checkpointing.checkpoint_model import CheckpointModel
    from kubetune.trainer.config import model_shaped

    checkpoint = CheckpointModel(Path("model"), config, architecture_of(config), [], None)
    cfg = OmegaConf.create({"device": "cuda", "dtype": "bf16", "fsdp_cpu_offload": True})
    notes = model_shaped.fit(cfg, checkpoint, "full", "llama3_3/70B_full", set(), gpus, H100)
    assert cfg.fsdp_cpu_offload is offloaded
    assert len(notes) == (0 if offloaded else 1)
    if not offloaded:
        assert notes[0].startswith("fsdp_cpu_offload: config llama3_3/70B_full offloads "
                                   "parameters to host memory; this checkpoint's weights, "
                                   "gradients and optimizer state take ")


def test_tensor_parallelism_is_refused_for_a_tied_output():
    from kubetune.errors import BadInputError
    from kubetune.model_family.architecture import architecture_of
    from kubetune.trainer.checkpointing.checkpoint_model import CheckpointModel
    from kubetune.trainer.config import model_shaped

    checkpoint = CheckpointModel(Path("model"), LLAMA_3_2_1B, architecture_of(LLAMA_3_2_1B),
                                 [], None)
    cfg = OmegaConf.create({"device": "cuda", "tensor_parallel_dim": 2})
    with pytest.raises(BadInputError, match="tensor_parallel_dim=2: this llama3_2 checkpoint "
                                            "ties its output to its embeddings"):
        model_shaped.fit(cfg, checkpoint, "full", "llama3_3/70B_full", {"tensor_parallel_dim"},
                         2, H100)
    cfg.tensor_parallel_dim = 1
    assert model_shaped.fit(cfg, checkpoint, "full", "llama3_3/70B_full", set(), 2, H100) == []


@pytest.mark.parametrize("processes, refused", [(1, False), (2, True)])
def test_qlora_on_several_processes_needs_whole_nf4_blocks_per_process(processes, refused):
    """FSDP splits each NF4 weight, its per-block scale factors included, into one part per
    process: k_proj of 192 x 256 is 3 blocks of 64 x 256, which 2 processes cannot share
    (torchao: 'quantization_factor.numel() not divisible by 2', from inside the recipe)."""
    from kubetune.errors import BadInputError
    from kubetune.model_family.architecture import architecture_of
    from kubetune.trainer.checkpointing.checkpoint_model import CheckpointModel
    from kubetune.trainer.config import model_shaped

    config = {"model_type": "qwen3", "vocab_size": 320, "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 96, "tie_word_embeddings": False}
    checkpoint = CheckpointModel(Path("model"), config, architecture_of(config), [], None)
    cfg = OmegaConf.create({"device": "cpu"})
    if not refused:
        assert model_shaped.fit(cfg, checkpoint, "qlora", "c", set(), processes, None) == []
        return
    with pytest.raises(BadInputError) as error:
        model_shaped.fit(cfg, checkpoint, "qlora", "c", set(), processes, None)
    assert str(error.value) == (
        "QLoRA cannot shard this model's NF4 weights over 2 processes: each projection's size "
        "must be a multiple of 16384 x 2 elements and its rows of 2, and k_proj 192x256, "
        "v_proj 192x256 are not; use 1 process, or method lora")
