"""`kubetune size`: what a fine-tuning run needs before admission (nodes, GPUs per node,
GPU memory per device, host memory per node, a resourcesPerNode block), answered from the
memory plan the trainer runs, on published model shapes, and in agreement with the
trainer's own `memory plan:` line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from kubetune.model_family.architecture import architecture_of
from kubetune.trainer.performance import sizing
from kubetune.trainer.performance.model_shape import parameter_count
from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.hub_server import HubServer

# The published config.json fields of Meta's Llama checkpoints (huggingface.co/meta-llama),
# as written there; no download.
_LLAMA_3_1 = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "initializer_range": 0.02, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256}
LLAMA_3_2_1B = {**_LLAMA_3_1, "hidden_size": 2048, "intermediate_size": 8192,
                "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
                "head_dim": 64, "tie_word_embeddings": True,
                "rope_scaling": {**_LLAMA_3_1["rope_scaling"], "factor": 32.0}}
LLAMA_3_1_8B = {**_LLAMA_3_1, "hidden_size": 4096, "intermediate_size": 14336,
                "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8}
# Llama-3.1-70B and Llama-3.3-70B share these.
LLAMA_3_1_70B = {**_LLAMA_3_1, "hidden_size": 8192, "intermediate_size": 28672,
                 "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8}
LLAMA_3_1_405B = {**_LLAMA_3_1, "hidden_size": 16384, "intermediate_size": 53248,
                  "num_attention_heads": 128, "num_hidden_layers": 126,
                  "num_key_value_heads": 8}
H100 = "81559Mi"  # nvidia-smi's memory.total of an H100 80GB HBM3
L4 = "23034Mi"  # of an L4 (24 GB)


def config_file(tmp_path, cfg: dict, name: str = "config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def size(*args: str, **env: str) -> dict:
    result = kubetune("size", *args, "--output", "json", env=clean_env(**env))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def size_fails(*args: str) -> tuple[int, list[str]]:
    result = kubetune("size", *args, env=clean_env())
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, error_lines(result)


# -- published shapes -----------------------------------------------------------------

def test_llama_1b_lora_takes_one_gpu(tmp_path):
    answer = size("--model", str(config_file(tmp_path, LLAMA_3_2_1B)), "--method", "lora",
                  "--gpu-memory", H100, "--gpus-per-node", "8")
    assert (answer["nodes"], answer["gpus_per_node"]) == (1, 1)
    assert answer["gpu_memory_gib_per_device"] < 79.6
    requests = answer["resourcesPerNode"]["requests"]
    assert requests["nvidia.com/gpu"] == 1
    assert answer["resourcesPerNode"]["limits"] == requests
    assert requests["memory"] == f"{-(-answer['host_memory_gib'] // 1):.0f}Gi"


def test_llama_70b_lora_fits_one_node_of_eight_80gb_gpus(tmp_path):
    answer = size("--model", str(config_file(tmp_path, LLAMA_3_1_70B)), "--method", "lora",
                  "--gpu-memory", H100, "--gpus-per-node", "8")
    assert answer["nodes"] == 1 and 1 < answer["gpus_per_node"] <= 8
    assert answer["gpu_memory_gib_per_device"] <= 79.6
    assert answer["resourcesPerNode"]["requests"]["nvidia.com/gpu"] == answer["gpus_per_node"]
    # Each process loads the whole 141 GB checkpoint into host memory first.
    assert answer["host_memory_gib"] >= answer["gpus_per_node"] * 131


def test_llama_70b_full_needs_more_than_one_such_node(tmp_path):
    answer = size("--model", str(config_file(tmp_path, LLAMA_3_1_70B)), "--method", "full",
                  "--gpu-memory", H100, "--gpus-per-node", "8")
    # 8 bytes a parameter (torchtune trains in bf16: weights, gradients and AdamW's two
    # moments) are 526 GiB: more than 8 GPUs' 60 GiB budgets, within 16's. torchtune's own
    # llama3_3/70B_full_multinode config says it is tested on 2 nodes of 8 H100s.
    assert (answer["nodes"], answer["gpus_per_node"]) == (2, 8)


def test_llama_8b_qlora_fits_a_24gb_card(tmp_path):
    answer = size("--model", str(config_file(tmp_path, LLAMA_3_1_8B)), "--method", "qlora",
                  "--gpu-memory", L4, "--gpus-per-node", "1")
    assert (answer["nodes"], answer["gpus_per_node"]) == (1, 1)
    assert answer["gpu_memory_gib_per_device"] <= 22.5
    assert answer["plan"]["micro_batch"] >= 1 and answer["plan"]["budget_gib"] <= 16.9


def test_a_longer_context_never_needs_less(tmp_path):
    model = str(config_file(tmp_path, LLAMA_3_1_8B))
    needs = []
    for length in (512, 2048, 8192, 16384, 32768):
        answer = size("--model", model, "--method", "full", "--gpu-memory", H100,
                      "--max-seq-len", str(length))
        needs.append((answer["nodes"] * answer["gpus_per_node"],
                      answer["gpu_memory_gib_per_device"], answer["host_memory_gib"]))
    gpus = [n[0] for n in needs]
    assert gpus == sorted(gpus) and gpus[-1] > gpus[0], needs
    for (g1, mem1, host1), (g2, mem2, host2) in zip(needs, needs[1:]):
        # On as many GPUs, each needs at least as much; on more, the node's memory grows.
        assert mem2 >= mem1 if g2 == g1 else host2 >= host1, needs


# -- the trainer says the same --------------------------------------------------------

@pytest.mark.parametrize("cfg, method, length, batch, gpu", [
    (LLAMA_3_2_1B, "lora", 2048, 4, H100),
    (LLAMA_3_1_70B, "lora", 2048, 4, H100),
    (LLAMA_3_1_70B, "full", 2048, 4, H100),
    (LLAMA_3_1_8B, "qlora", 4096, 8, L4),
    (LLAMA_3_1_8B, "full", 1024, 2, H100),
    (LLAMA_3_1_8B, "dora", 2048, 4, "48Gi"),
], ids=["1b-lora", "70b-lora", "70b-full", "8b-qlora-l4", "8b-full", "8b-dora-48gi"])
def test_the_trainer_states_the_same_plan(tmp_path, cfg, method, length, batch, gpu):
    """The trainer's `memory plan:` line, for the topology `kubetune size` answered, with
    the recipe and base config the trainer picks there and the same batch_size and
    max_seq_len as TrainJob args, is `kubetune size`'s own line."""
    from kubetune import quantity
    from kubetune.trainer.config.recipe_config import apply_overrides, load_config
    from kubetune.trainer.performance import speed
    from kubetune.trainer.request import methods
    from kubetune.trainer.request.topology import Topology

    model = config_file(tmp_path, cfg)
    result = kubetune("size", "--model", str(model), "--method", method, "--max-seq-len",
                      str(length), "--batch-size", str(batch), "--gpu-memory", gpu,
                      env=clean_env())
    assert result.returncode == 0, result.stderr
    size_line = next(line for line in result.stdout.splitlines()
                     if line.startswith("memory plan:"))
    answer = size("--model", str(model), "--method", method, "--max-seq-len", str(length),
                  "--batch-size", str(batch), "--gpu-memory", gpu)

    topology = Topology(answer["nodes"], answer["gpus_per_node"], 0, None)
    _, config, implied = methods.recipe_for(method, topology)
    overrides = [*implied, f"batch_size={batch}", f"tokenizer.max_seq_len={length}"]
    trainer_cfg = apply_overrides(load_config(config), overrides)
    dims = architecture_of(cfg).shape
    # The checkpoint as its bf16 weight files weigh: 2 bytes a parameter.
    notes = speed.apply(trainer_cfg, {"batch_size", "tokenizer.max_seq_len"}, "cuda",
                        topology.world_size, None, None, length, method=method, dims=dims,
                        gpu_memory_bytes=quantity.memory_bytes(gpu), nodes=topology.nnodes,
                        checkpoint_bytes=2 * parameter_count(dims))
    assert [n for n in notes if n.startswith("memory plan:")] == [size_line]


def test_the_base_configs_hold_what_sizing_assumes():
    # `kubetune size` runs without torchtune (the initializer image): what it assumes of
    # each base config the trainer can pick is checked against torchtune's own here.
    from kubetune.trainer.config.recipe_config import load_config

    for name, (accumulation, in_backward) in sizing.BASE_CONFIG_PLAN.items():
        cfg = load_config(name)
        assert int(cfg.gradient_accumulation_steps) == accumulation, name
        assert bool(cfg.get("optimizer_in_bwd")) == in_backward, name
        assert str(cfg.get("dtype")) == sizing.DTYPE, name
        if "lora" in name:
            for key, value in sizing.BASE_LORA.items():
                assert cfg.model[key] == value, (name, key)


# -- where the model comes from -------------------------------------------------------

def test_a_hub_model_is_sized_from_its_config_json_alone(tmp_path):
    hub = HubServer(token="hf_sizing_token").start()
    try:
        hub.add_repo("meta/llama-8b", {"config.json": json.dumps(LLAMA_3_1_8B).encode(),
                                        "model-00001-of-00004.safetensors": b"\0" * 20000},
                     private=True)
        answer = size("--model", "hf://meta/llama-8b", HF_ENDPOINT=hub.url,
                      ACCESS_TOKEN="hf_sizing_token")
        paths = [r.path for r in hub.requests]
    finally:
        hub.stop()
    assert paths == ["/meta/llama-8b/resolve/main/config.json"]
    local = size("--model", str(config_file(tmp_path, LLAMA_3_1_8B)))
    assert {**answer, "model": None} == {**local, "model": None}


def test_a_hub_repo_without_config_json_is_one_line():
    hub = HubServer().start()
    try:
        hub.add_repo("org/weights-only", {"README.md": b"# no config\n"})
        result = kubetune("size", "--model", "hf://org/weights-only",
                          env=clean_env(HF_ENDPOINT=hub.url))
    finally:
        hub.stop()
    assert result.returncode == 65, result.stderr
    assert error_lines(result) == ["error: size: hf://org/weights-only: the repo has no "
                                   "config.json (is it a transformers model?)"]


def test_a_model_directory_counts_its_weight_files(tiny_model_dir):
    answer = size("--model", str(tiny_model_dir), "--gpu-memory", "24Gi")
    weights = sum(p.stat().st_size for p in tiny_model_dir.glob("*.safetensors"))
    assert answer["checkpoint_from"] == "weight files"
    assert answer["host_memory_gib"] == round(weights / 0.8 / 2 ** 30, 1)


def test_size_needs_no_torch_stack(tmp_path):
    # The initializer image has the core dependencies only: sizing must import none of
    # the torch stack (a finder refuses them, as their absence would).
    model = config_file(tmp_path, LLAMA_3_1_70B)
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'torchtune', 'torchao', 'omegaconf',\n"
        "                                  'safetensors', 'datasets'):\n"
        "            raise ImportError(name + ' is not in this image')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from kubetune.entrypoints.cli import main\n"
        f"main(['size', '--model', {str(model)!r}, '--method', 'full'])\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=clean_env())
    assert result.returncode == 0, result.stderr
    assert "trainer:\n  numNodes:" in result.stdout


# -- failures a user can cause: one line ------------------------------------------------

def test_an_unknown_model_type_is_the_trainers_line(tmp_path):
    code, lines = size_fails("--model", str(config_file(tmp_path, {
        **LLAMA_3_1_8B, "model_type": "mamba", "architectures": ["MambaForCausalLM"]})))
    assert code == 65
    assert len(lines) == 1 and "model_type 'mamba'" in lines[0] and "supported:" in lines[0]


def test_more_nodes_than_allowed_says_how_many(tmp_path):
    code, lines = size_fails("--model", str(config_file(tmp_path, LLAMA_3_1_405B)),
                             "--method", "full", "--gpu-memory", "24Gi", "--max-nodes", "1")
    answer = size("--model", str(config_file(tmp_path, LLAMA_3_1_405B)), "--method", "full",
                  "--gpu-memory", "24Gi")
    assert code == 65 and len(lines) == 1
    assert f"needs {answer['nodes']} nodes of 8 x 24.0 GiB GPUs" in lines[0]
    assert "more than --max-nodes 1" in lines[0]


def test_a_context_no_number_of_nodes_holds_is_one_line(tmp_path):
    code, lines = size_fails("--model", str(config_file(tmp_path, LLAMA_3_1_8B)),
                             "--method", "full", "--max-seq-len", "131072")
    assert code == 65 and len(lines) == 1
    assert "on any number of nodes" in lines[0] and "--max-seq-len" in lines[0]


def test_qlora_that_needs_several_nodes_names_what_fits(tmp_path):
    code, lines = size_fails("--model", str(config_file(tmp_path, LLAMA_3_1_405B)),
                             "--method", "qlora", "--gpu-memory", "24Gi")
    assert code == 65 and len(lines) == 1
    assert "QLoRA runs on one node only" in lines[0] and "use lora on" in lines[0]


@pytest.mark.parametrize("args, env, shown", [
    (["--gpu-memory", "lots"], {}, "'lots' is not a memory size"),
    ([], {"KUBETUNE_GPU_MEMORY": "80 gigs"}, "invalid value in KUBETUNE_GPU_MEMORY"),
    (["--method", "prefix"], {}, "'prefix' is not one of"),
])
def test_bad_options_are_one_usage_line(tmp_path, args, env, shown):
    result = kubetune("size", "--model", str(config_file(tmp_path, LLAMA_3_1_8B)), *args,
                      env=clean_env(**env))
    assert result.returncode == 2
    lines = error_lines(result)
    assert len(lines) == 1 and shown in lines[0], result.stderr


def test_options_beat_their_variables_which_beat_defaults(tmp_path):
    model = str(config_file(tmp_path, LLAMA_3_1_8B))
    default = size("--model", model)
    from_env = size(KUBETUNE_SIZE_MODEL=model, KUBETUNE_METHOD="full",
                    KUBETUNE_GPUS_PER_NODE="1", KUBETUNE_MAX_SEQ_LEN="1024")
    option = size("--model", model, "--method", "qlora", KUBETUNE_METHOD="full")
    assert (default["method"], default["max_seq_len"]) == ("lora", 2048)
    assert (from_env["method"], from_env["max_seq_len"], from_env["gpus_per_node"]) == \
        ("full", 1024, 1)
    assert option["method"] == "qlora"


def test_yaml_output_is_the_json_answer(tmp_path):
    model = str(config_file(tmp_path, LLAMA_3_2_1B))
    result = kubetune("size", "--model", model, "--output", "yaml", env=clean_env())
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout) == size("--model", model)
