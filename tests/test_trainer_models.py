"""Any model, any size: the dry run shows the builder, checkpointer type, shards and
tokenizer chosen from each checkpoint's own files (weights are not read in a dry run)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.trainer import make_pvc, tune_run

DIMS = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
        "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}


def fake_checkpoint(root, config: dict, files: dict[str, str], shards: int = 1):
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({**DIMS, **config}))
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for name in names:
        (root / name).write_bytes(b"")
    if shards > 1:
        (root / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {f"w{i}": n for i, n in enumerate(names)}}))
    return root


TIKTOKEN = "IQ== 0\nIg== 1\n"
CASES = {
    "llama3.1 with rope scaling, 4 shards": (
        {"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        {"original/tokenizer.model": TIKTOKEN}, 4,
        "torchtune.models.llama3_1.lora_llama3_1", "LLAMA3", "llama3_tokenizer"),
    "llama3.2 tied embeddings": (
        {"model_type": "llama", "tie_word_embeddings": True,
         "rope_scaling": {"rope_type": "llama3", "factor": 32.0}},
        {"original/tokenizer.model": TIKTOKEN}, 1,
        "torchtune.models.llama3_2.lora_llama3_2", "LLAMA3_2", "llama3_tokenizer"),
    "mistral": ({"model_type": "mistral"}, {"tokenizer.model": "sentencepiece"}, 2,
                "torchtune.models.mistral.lora_mistral", "MISTRAL", "mistral_tokenizer"),
    "gemma": ({"model_type": "gemma", "head_dim": 32}, {"tokenizer.model": "sentencepiece"}, 1,
              "torchtune.models.gemma.lora_gemma", "GEMMA", "gemma_tokenizer"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_builds_from_the_checkpoint(tmp_path, tiny_dataset_dir, case):
    config, files, shards, component, model_type, tokenizer = CASES[case]
    model = fake_checkpoint(tmp_path / "model-src", config, files, shards)
    pvc = make_pvc(tmp_path / "pvc", model, tiny_dataset_dir)
    result = tune_run(pvc, "lora_finetune_single_device", "--config",
                      "llama3_2/1B_lora_single_device", f"output_dir={pvc.output}",
                      f"checkpointer.checkpoint_dir={pvc.model}",
                      "dataset=torchtune.datasets.instruct_dataset",
                      f"dataset.data_dir={pvc.dataset}/.", "--kubetune-dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    cfg = yaml.safe_load(result.stdout.split("config:\n", 1)[1].split("\ncommand: ", 1)[0])
    assert cfg["model"]["_component_"] == component
    assert cfg["model"]["num_layers"] == 3 and cfg["model"]["embed_dim"] == 256
    assert cfg["checkpointer"]["model_type"] == model_type
    assert len(cfg["checkpointer"]["checkpoint_files"]) == shards
    assert cfg["tokenizer"]["_component_"].endswith(tokenizer)
    if case == "gemma":
        assert "apply_lora_to_output" not in cfg["model"]  # its builder ties the output
    if case.startswith("llama3.2"):
        assert cfg["model"]["tie_word_embeddings"] is True
        assert cfg["model"]["scale_factor"] == 32
    assert not pvc.output.exists()
