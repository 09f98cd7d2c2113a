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
    # Whole safetensors files with one small tensor each (the index names them): the
    # trainer checks weight headers before planning, and a dry run reads nothing more.
    for i, name in enumerate(names):
        header = json.dumps({f"w{i}": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
        header += " " * (-len(header) % 8)
        (root / name).write_bytes(len(header).to_bytes(8, "little") + header.encode() + bytes(4))
    if shards > 1:
        (root / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {f"w{i}": n for i, n in enumerate(names)}}))
    return root


TIKTOKEN = "IQ== 0\nIg== 1\n"
QWEN3_TOKENS = json.dumps({"added_tokens": [
    {"id": 151643 + i, "content": t, "special": True} for i, t in enumerate(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
         "<think>", "</think>"])]})
DECODER = "kubetune.trainer.models.decoder.lora_decoder"
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
    # transformers 5 writes RoPE scaling as rope_parameters, rope_theta inside.
    "llama3.1 as transformers 5 writes it": (
        {"model_type": "llama", "rope_parameters": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0}},
        {"original/tokenizer.model": TIKTOKEN}, 1,
        "torchtune.models.llama3_1.lora_llama3_1", "LLAMA3", "llama3_tokenizer"),
    # A tied Llama without RoPE scaling (SmolLM-style): Llama 3.2's tied builder at factor
    # 1, which leaves RoPE plain.
    "llama3.2 builder, tied, plain RoPE": (
        {"model_type": "llama", "tie_word_embeddings": True},
        {"original/tokenizer.model": TIKTOKEN}, 1,
        "torchtune.models.llama3_2.lora_llama3_2", "LLAMA3_2", "llama3_tokenizer"),
    "mistral": ({"model_type": "mistral"}, {"tokenizer.model": "sentencepiece"}, 2,
                "torchtune.models.mistral.lora_mistral", "MISTRAL", "mistral_tokenizer"),
    "gemma": ({"model_type": "gemma", "head_dim": 32}, {"tokenizer.model": "sentencepiece"}, 1,
              "torchtune.models.gemma.lora_gemma", "GEMMA", "gemma_tokenizer"),
    # transformers 5's config.json: rope_theta inside rope_parameters.
    "qwen3 head_dim != hidden/heads, 2 shards": (
        {"model_type": "qwen3", "head_dim": 128, "tie_word_embeddings": False,
         "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}},
        {"vocab.json": "{}", "merges.txt": "#version: 0.2\n", "tokenizer.json": QWEN3_TOKENS},
        2, DECODER, "CONFIG_DECODER", "qwen2_5_tokenizer"),
    "gemma2": ({"model_type": "gemma2", "head_dim": 64, "query_pre_attn_scalar": 64,
                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                "sliding_window": 4096}, {"tokenizer.model": "sentencepiece"}, 1,
               DECODER, "CONFIG_DECODER", "gemma_tokenizer"),
    # Gemma 3 as Google's hub config writes it (rope_theta and rope_local_base_freq, a
    # sliding_window_pattern, no layer_types), with only a tokenizer.json.
    "gemma3_text, hub config": (
        {"model_type": "gemma3_text", "head_dim": 64, "query_pre_attn_scalar": 64,
         "sliding_window": 512, "sliding_window_pattern": 3, "rope_theta": 1000000.0,
         "rope_local_base_freq": 10000.0, "tie_word_embeddings": True},
        {"tokenizer.json": QWEN3_TOKENS}, 1, DECODER, "CONFIG_DECODER", "fast_tokenizer"),
    "olmo2": ({"model_type": "olmo2", "tie_word_embeddings": False},
              {"tokenizer.json": QWEN3_TOKENS}, 1, DECODER, "CONFIG_DECODER", "fast_tokenizer"),
    "phi3 (sentencepiece)": ({"model_type": "phi3", "rope_scaling": None},
                             {"tokenizer.model": "sentencepiece"}, 2,
                             "torchtune.models.phi3.lora_phi3", "PHI3_MINI",
                             "phi3_mini_tokenizer"),
    "phi4 (byte-level BPE)": ({"model_type": "phi3", "rope_theta": 250000},
                              {"vocab.json": "{}", "merges.txt": "#version: 0.2\n"}, 1,
                              "torchtune.models.phi3.lora_phi3", "PHI3_MINI", "phi4_tokenizer"),
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
    if case.startswith("qwen3"):
        assert cfg["model"]["head_dim"] == 128 and cfg["model"]["rope_base"] == 1e6
        assert cfg["checkpointer"]["_component_"].endswith("DecoderHFCheckpointer")
        assert cfg["model"]["qk_norm"] == "head"
        assert cfg["tokenizer"]["special_tokens_path"].endswith("tokenizer.json")
    if case == "gemma2":
        assert cfg["model"]["attn_softcap"] == 50.0
        assert cfg["model"]["final_softcap"] == 30.0
        assert cfg["model"]["sliding_layers"] == [1, 0, 1]  # Gemma 2 alternates
        assert "apply_lora_to_output" not in cfg["model"]
    if case.startswith("gemma3"):
        assert cfg["model"]["sliding_layers"] == [1, 1, 0]
        assert cfg["model"]["rope_base"] == 1e6 and cfg["model"]["sliding_rope_base"] == 1e4
        assert cfg["model"]["norm"] == "rms_one_plus" and cfg["model"]["embed_scale"] == 16.0
        assert "apply_lora_to_output" not in cfg["model"]
    if case == "olmo2":
        assert cfg["model"]["placement"] == "post" and cfg["model"]["qk_norm"] == "projection"
    if case.startswith("llama3.2"):
        assert cfg["model"]["tie_word_embeddings"] is True
        assert cfg["model"]["scale_factor"] == (1 if "plain" in case else 32)
        assert "apply_lora_to_output" not in cfg["model"]  # the output is the embedding
    if case.startswith("llama3.1"):
        assert cfg["model"]["scale_factor"] == 8 and cfg["model"]["rope_base"] == 500000
    assert not pvc.output.exists()


REFUSED = {
    "qwen3 with YaRN": ({"model_type": "qwen3", "rope_scaling": {"rope_type": "yarn",
                                                                  "factor": 4.0}},
                        "qwen3 checkpoint: rope type 'yarn' is not supported"),
    "phi-3.5 longrope": ({"model_type": "phi3", "rope_scaling": {"type": "longrope"}},
                         "phi3 checkpoint: rope type 'longrope'"),
    "llama with linear RoPE scaling": (
        {"model_type": "llama", "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        "llama checkpoint: rope type 'linear', which torchtune's llama builder cannot run"),
    "llama3 RoPE from another original context": (
        {"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                 "original_max_position_embeddings": 4096}},
        "llama checkpoint: llama3 RoPE original_max_position_embeddings 4096"),
    "qwen3 moe": ({"model_type": "qwen3_moe", "num_experts": 128},
                  "model_type 'qwen3_moe' in config.json: num_experts: mixture-of-experts "
                  "layers are not supported"),
    "hybrid linear attention": (
        {"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention",
                                                     "linear_attention"]},
        "linear-attention, convolution or Mamba layers are not supported"),
    "latent attention": ({"model_type": "deepseek_v3", "kv_lora_rank": 512},
                         "kv_lora_rank: latent attention (MLA) is not supported"),
    "a type no row names": ({"model_type": "acme_lm"},
                            "no family row names it; add one in "
                            "kubetune/model_family/families.py"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_a_family_cannot_do_is_one_line_65(tmp_path, tiny_dataset_dir, case):
    config, message = REFUSED[case]
    model = fake_checkpoint(tmp_path / "model-src", config, {"tokenizer.model": "spm"})
    pvc = make_pvc(tmp_path / "pvc", model, tiny_dataset_dir)
    result = tune_run(pvc, "lora_finetune_single_device", "--config",
                      "llama3_2/1B_lora_single_device", f"output_dir={pvc.output}",
                      f"checkpointer.checkpoint_dir={pvc.model}", "--kubetune-dry-run")
    assert result.returncode == 65, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
