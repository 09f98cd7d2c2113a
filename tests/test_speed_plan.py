"""Fast by default: what `tune run ... --kubetune-dry-run` decides for the user's data
layout (packing over every shard and format), and the planners behind the CUDA defaults
(memory plan, compile, MFU) on real model shapes, with pure inputs: this machine has no
GPU, and the launcher plans for the machine it runs on."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml
from omegaconf import OmegaConf

from kubetune.tools.demo import TinyModelSpec, write_tiny_model
from kubetune.tools.demo.alpaca_like import alpaca_like_rows, write_alpaca_like
from tests.support.trainer import make_pvc, tune_run
from tests.test_trainer_runs import SDK_LORA_ARGS, on_pvc
from kubetune.trainer.data import dataset_check
from kubetune.trainer.performance import memory_plan, model_shape, speed
from kubetune.trainer.metric_logging.summary import summarize, warmup_count

LLAMA_3_2_1B = {"embed_dim": 2048, "num_layers": 16, "vocab_size": 128256, "num_heads": 32,
                "num_kv_heads": 8, "intermediate_dim": 8192, "tie_word_embeddings": True}
LLAMA_3_1_8B = {"embed_dim": 4096, "num_layers": 32, "vocab_size": 128256, "num_heads": 32,
                "num_kv_heads": 8, "intermediate_dim": 14336}
H100_80GB = 81559 * 2 ** 20  # nvidia-smi's memory.total for an H100 80GB HBM3
L4_24GB = 23034 * 2 ** 20
# What torchtune's llama3_2/1B_lora and llama3_1/8B_lora configs adapt.
LORA_1B = {"lora_attn_modules": ["q_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True,
           "lora_rank": 64}
LORA_8B = {"lora_attn_modules": ["q_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True,
           "lora_rank": 8}
ROWS = 1000  # alpaca-like (~287 tokens each): enough for 20+ steps of 2048-token packs


# --- the dry-run plan for each data layout -------------------------------------------------

@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    """The tiny Llama-3 with 4096 positions, so 2048-token packs are possible."""
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny-4k",
                            TinyModelSpec(max_position_embeddings=4096))


def kubeflow_dry_run(tmp_path, model, fmt: str, shards: int) -> tuple[dict, list[str]]:
    """The Kubeflow-shaped command (distributed recipe, SDK LoRA args) on ROWS
    alpaca-like rows written as ``shards`` files of ``fmt``: the merged config and notes."""
    dataset = tmp_path / f"dataset-{fmt}-{shards}"
    write_alpaca_like(dataset, ROWS, shards, fmt)
    pvc = make_pvc(tmp_path / f"pvc-{fmt}-{shards}", model, dataset)
    source = {"jsonl": "json"}.get(fmt, fmt)
    args = [a.replace("dataset.source=parquet", f"dataset.source={source}")
            for a in on_pvc(SDK_LORA_ARGS, pvc)]
    result = tune_run(pvc, "--nnodes", "1", "--nproc_per_node", "1",
                      "lora_finetune_distributed", "--config", "llama3_2/1B_lora",
                      *pvc.runtime_args(), *args, "tokenizer.max_seq_len=2048",
                      "--kubetune-dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    cfg = yaml.safe_load(result.stdout.split("config:\n", 1)[1].split("\ncommand: ", 1)[0])
    notes = [line[6:] for line in result.stdout.splitlines() if line.startswith("note: ")]
    return cfg, notes


def packed_rows(notes: list[str]) -> int | None:
    """The rows the packing decision counted (this machine has no GPU: it decides not to
    pack, and says over how many rows)."""
    for note in notes:
        m = re.match(r"speed: (?:not )?packing (\d+) samples", note)
        if m:
            return int(m.group(1))
    return None


def test_four_parquet_shards_are_planned_like_one_file(tmp_path, long_context_model):
    one_cfg, one_notes = kubeflow_dry_run(tmp_path, long_context_model, "parquet", 1)
    four_cfg, four_notes = kubeflow_dry_run(tmp_path, long_context_model, "parquet", 4)
    # On CPU, short samples stay unpacked (dense packed attention), whatever the layout.
    assert one_cfg["dataset"]["packed"] is False and four_cfg["dataset"]["packed"] is False
    assert packed_rows(one_notes) == packed_rows(four_notes) == ROWS
    for key in ("batch_size", "gradient_accumulation_steps", "compile", "loss", "optimizer",
                "enable_activation_checkpointing"):
        assert one_cfg[key] == four_cfg[key], key
    assert one_cfg["tokenizer"]["max_seq_len"] == four_cfg["tokenizer"]["max_seq_len"] == 2048
    # Each speed decision says how to turn it off.
    for note in four_notes:
        if note.startswith("speed:"):
            assert re.search(r"to (turn off|force|choose yourself)", note), note


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "arrow", "json"])
def test_sharded_jsonl_csv_arrow_json_are_counted_whole(tmp_path, long_context_model, fmt):
    cfg, notes = kubeflow_dry_run(tmp_path, long_context_model, fmt, 4)
    assert cfg["dataset"]["packed"] is False and cfg["tokenizer"]["max_seq_len"] == 2048
    # csv counts newlines, corrected for answers that span lines: an estimate.
    assert packed_rows(notes) == pytest.approx(ROWS, rel=0.05 if fmt == "csv" else 0)


def test_saved_arrow_dataset_counts_only_its_arrow_files(tmp_path):
    """`datasets.save_to_disk` leaves state.json and dataset_info.json beside the shards."""
    files = write_alpaca_like(tmp_path, 300, 3, "arrow")
    (tmp_path / "data" / "state.json").write_text(json.dumps({"_data_files": []}, indent=2))
    (tmp_path / "data" / "dataset_info.json").write_text("{}")
    found = dataset_check.sample(OmegaConf.create({"source": "arrow",
                                                  "data_dir": str(tmp_path / "data")}))
    assert found.files == files and found.total_rows == 300 and found.rows_exact


# --- row counts and the length sample ------------------------------------------------------

@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "json", "arrow"])
def test_row_count_is_exact_where_the_format_says(tmp_path, fmt):
    write_alpaca_like(tmp_path, 777, 5, fmt)
    found = dataset_check.sample(OmegaConf.create({"data_dir": str(tmp_path / "data")}))
    assert len(found.files) == 5 and found.total_rows == 777 and found.rows_exact
    assert found.columns == ["input", "output"]


def test_arrow_ipc_file_format_is_counted_too(tmp_path):
    import pyarrow as pa

    table = pa.Table.from_pylist(alpaca_like_rows(250))
    with pa.OSFile(str(tmp_path / "train.arrow"), "wb") as sink, \
            pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=100)
    found = dataset_check.sample(OmegaConf.create({"data_files": str(tmp_path / "train.arrow")}))
    assert found.total_rows == 250 and found.rows_exact and len(found.rows) == 250


def test_csv_with_multiline_answers_is_estimated_closely(tmp_path):
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rows = alpaca_like_rows(2000)
    for i, row in enumerate(rows):
        if i % 3 == 0:
            row["output"] = row["output"].replace(". ", ".\n") + "\n1. a\n2. b"
    pcsv.write_csv(pa.Table.from_pylist(rows), tmp_path / "train.csv")
    found = dataset_check.sample(OmegaConf.create({"data_files": [str(tmp_path / "train.csv")]}))
    assert not found.rows_exact
    assert found.total_rows == pytest.approx(2000, rel=0.1)


def test_a_large_json_array_is_estimated_from_its_head(tmp_path):
    rows = alpaca_like_rows(9000)  # ~11 MB: over the bounded parse's 8 MiB
    (tmp_path / "train.json").write_text(json.dumps(rows))
    found = dataset_check.sample(OmegaConf.create({"data_files": str(tmp_path / "train.json")}))
    assert (tmp_path / "train.json").stat().st_size > 8 << 20
    assert not found.rows_exact and found.total_rows == pytest.approx(9000, rel=0.1)
    assert found.columns == ["input", "output"]


def test_length_sample_spreads_across_shards(tmp_path):
    """Shards sorted by length (common after a length-bucketing export): the first shard
    alone would say the samples are short."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data").mkdir()
    true_total = 0
    for i in range(16):
        text = "word " * (10 + 60 * i)
        pq.write_table(pa.table({"input": ["q"] * 100, "output": [text] * 100}),
                       tmp_path / "data" / f"part-{i:02d}.parquet")
        true_total += 100 * (1 + len(text))
    ds = OmegaConf.create({"_component_": "torchtune.datasets.instruct_dataset",
                           "data_dir": str(tmp_path / "data")})
    found = dataset_check.sample(ds)
    assert found.total_rows == 1600
    assert dataset_check.mean_chars(ds, found) == pytest.approx(true_total / 1600, rel=0.1)


# --- the memory planner on real shapes (80 GB card) -----------------------------------------

def workload(dims, method, seq_len, lora=LORA_1B, world=1, in_bwd=False):
    return memory_plan.Workload(dims, method, "bf16", seq_len, world,
                                model_shape.adapter_count(dims, lora, method), in_bwd)


def test_state_bytes_follow_the_documented_formula():
    n = 1_235_814_400
    assert memory_plan.state_bytes(workload(LLAMA_3_2_1B, "full", 2048)) == 4 * 2 * n
    assert memory_plan.state_bytes(workload(LLAMA_3_2_1B, "full", 2048, world=8)) == n
    lora = workload(LLAMA_3_2_1B, "lora", 2048)
    assert memory_plan.state_bytes(lora) == 2 * n + 4 * 2 * lora.n_adapter
    q = 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192)  # NF4: the projections
    assert memory_plan.state_bytes(workload(LLAMA_3_2_1B, "qlora", 2048)) == \
        q * 0.5625 + (n - q) * 2 + 4 * 2 * lora.n_adapter


@pytest.mark.parametrize("method", ["lora", "qlora", "full"])
def test_llama_1b_on_80gb_trains_a_larger_micro_batch_without_checkpointing(method):
    w = workload(LLAMA_3_2_1B, method, 2048)
    plan = memory_plan.choose(w, H100_80GB, batch_size=4, accumulation=8,
                              checkpointing=None, split_fixed=False)
    assert plan.fits and not plan.activation_checkpointing
    assert plan.batch_size * plan.gradient_accumulation_steps == 32
    assert plan.batch_size >= 8  # the configs' 4 leaves most of the card idle
    assert plan.estimate_bytes <= 0.75 * H100_80GB
    # The next larger split would not fit: the plan uses the card.
    assert memory_plan.estimate_bytes(w, plan.batch_size * 2, False) > plan.budget_bytes


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_llama_8b_adapters_on_80gb_fit_4096_token_packs(method):
    w = workload(LLAMA_3_1_8B, method, 4096, LORA_8B)
    plan = memory_plan.choose(w, H100_80GB, batch_size=2, accumulation=8,
                              checkpointing=None, split_fixed=False)
    assert plan.fits and not plan.activation_checkpointing
    assert plan.batch_size * plan.gradient_accumulation_steps == 16
    assert plan.batch_size * 4096 >= memory_plan.MIN_TOKENS_PER_MICRO_BATCH


def test_llama_8b_full_needs_more_than_one_80gb_card():
    one = memory_plan.choose(workload(LLAMA_3_1_8B, "full", 2048), H100_80GB, 2, 8, None,
                             False)
    assert not one.fits  # 64 GB of bf16 weights, gradients and AdamW moments alone
    eight = memory_plan.choose(workload(LLAMA_3_1_8B, "full", 2048, world=8), H100_80GB, 2,
                               8, None, False)
    assert eight.fits and eight.batch_size * eight.gradient_accumulation_steps == 16
    # torchtune's single-device full config steps the optimizer in backward: no gradients
    # held, but no accumulation either.
    in_bwd = memory_plan.choose(workload(LLAMA_3_1_8B, "full", 2048, in_bwd=True), H100_80GB,
                                2, 1, None, True)
    assert in_bwd.fits and in_bwd.activation_checkpointing and in_bwd.batch_size == 2


def test_a_smaller_card_checkpoints_activations():
    plan = memory_plan.choose(workload(LLAMA_3_1_8B, "qlora", 2048, LORA_8B), L4_24GB, 2, 8,
                              None, False)
    assert plan.fits and plan.activation_checkpointing
    assert memory_plan.estimate_bytes(workload(LLAMA_3_1_8B, "qlora", 2048, LORA_8B), 1,
                                      False) > plan.budget_bytes


def test_what_the_user_fixed_stays_in_the_memory_plan():
    w = workload(LLAMA_3_2_1B, "lora", 2048)
    forced = memory_plan.choose(w, H100_80GB, 4, 8, checkpointing=True, split_fixed=False)
    assert forced.activation_checkpointing and forced.batch_size == 32
    fixed = memory_plan.choose(w, H100_80GB, 4, 8, checkpointing=None, split_fixed=True)
    assert (fixed.batch_size, fixed.gradient_accumulation_steps) == (4, 8)


# --- the CUDA defaults, planned with this machine's CPU standing in -------------------------

def cuda_cfg(**extra):
    return OmegaConf.create({
        "batch_size": 4, "gradient_accumulation_steps": 8, "compile": False, "dtype": "bf16",
        "enable_activation_checkpointing": True,
        "loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"},
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 3e-4},
        "model": {"_component_": "torchtune.models.llama3_2.lora_llama3_2", **LORA_1B},
        "dataset": {"_component_": "torchtune.datasets.instruct_dataset"},
        "tokenizer": {"max_seq_len": None}, **extra})


def test_cuda_plan_compiles_packs_and_fits_the_gpu():
    cfg = cuda_cfg()
    notes = speed.apply(cfg, {"batch_size"}, "cuda", 1, mean_chars=1150, rows=52_000,
                        max_seq_len=2048, method="lora", dims=LLAMA_3_2_1B,
                        gpu_memory_bytes=H100_80GB)
    assert cfg.compile is True and cfg.optimizer.fused is True and cfg.dataset.packed is True
    assert cfg.batch_size * cfg.gradient_accumulation_steps == 32 and cfg.batch_size > 4
    assert cfg.enable_activation_checkpointing is False
    speed_notes = [n for n in notes if n.startswith("speed:")]
    assert len(speed_notes) == 4  # fused AdamW, compile, packing, memory plan
    assert all(re.search(r"to (turn off|choose yourself)", n) for n in speed_notes)


def test_cuda_plan_keeps_what_the_user_said():
    cfg = cuda_cfg(compile=False)
    user = {"compile", "batch_size", "gradient_accumulation_steps",
            "enable_activation_checkpointing"}
    notes = speed.apply(cfg, user, "cuda", 1, mean_chars=None, rows=None, max_seq_len=2048,
                        method="lora", dims=LLAMA_3_2_1B, gpu_memory_bytes=H100_80GB)
    assert cfg.compile is False and cfg.enable_activation_checkpointing is True
    assert (cfg.batch_size, cfg.gradient_accumulation_steps) == (4, 8)
    assert not [n for n in notes if "compile" in n or n.startswith("speed: micro-batch")]
    # Their plan is still stated (what `kubetune size` would answer), not changed.
    assert [n for n in notes if n.startswith("memory plan:") and "micro-batch 4 x 8" in n]


def test_cpu_plan_is_as_before():
    cfg = cuda_cfg(compile=True)
    speed.apply(cfg, set(), "cpu", 1, mean_chars=None, rows=None, max_seq_len=2048,
                method="lora", dims=LLAMA_3_2_1B, gpu_memory_bytes=None)
    assert cfg.compile is False and (cfg.batch_size, cfg.gradient_accumulation_steps) == (4, 8)
    assert cfg.enable_activation_checkpointing is True


@pytest.mark.parametrize("packed,in_backward,device,sizes", [
    (True, False, "cpu", (1, 32)),    # the user's 4 x 8: 32 micro-batches of one pack
    (False, False, "cpu", (4, 8)),    # padded rows: as the user said
    (True, True, "cpu", (4, 8)),      # optimizer_in_bwd cannot accumulate
    (True, False, "cuda", (4, 8)),    # CUDA: the memory plan's (absent here), not this rule
], ids=["cpu-packed", "cpu-unpacked", "cpu-optimizer-in-backward", "cuda-packed"])
def test_a_packed_batch_on_cpu_runs_one_pack_per_forward(packed, in_backward, device, sizes):
    cfg = cuda_cfg(dataset={"packed": packed}, optimizer_in_bwd=in_backward,
                   tokenizer={"max_seq_len": 2048})
    notes = speed.apply(cfg, {"batch_size", "gradient_accumulation_steps", "dataset.packed"},
                        device, 1, mean_chars=None, rows=None, max_seq_len=2048)
    assert (cfg.batch_size, cfg.gradient_accumulation_steps) == sizes
    split = [n for n in notes if n.startswith("speed: one pack per forward")]
    assert split == ([f"speed: one pack per forward on cpu: batch_size=4 "
                      f"gradient_accumulation_steps=8 runs as 1 x 32, the same packs in each "
                      f"optimizer step (faster per pack on CPU, and a step holds one pack's "
                      f"activations, not 4)"] if sizes == (1, 32) else [])


# --- MFU's FLOPs and the steady state in summary.json ---------------------------------------

def test_flops_per_token_by_method_on_llama_1b():
    n, d_attn, layers = 1_235_814_400, 32 * 64, 16
    attention = 12 * layers * d_attn * 2048
    assert model_shape.flops_per_token(LLAMA_3_2_1B, "full", 0, 2048) == 6 * n + attention
    a = model_shape.adapter_count(LLAMA_3_2_1B, LORA_1B, "lora")
    # q (2048->2048), v (2048->512), output_proj (2048->2048), w1/w3 (2048->8192),
    # w2 (8192->2048), rank 64, 16 layers.
    assert a == 16 * 64 * ((2048 + 2048) + (2048 + 512) + (2048 + 2048) + 3 * (2048 + 8192))
    assert model_shape.flops_per_token(LLAMA_3_2_1B, "lora", a, 2048) == \
        4 * n + 6 * a + attention
    # LoRA does about 2/3 of full fine-tuning's work per token, not the same.
    ratio = model_shape.flops_per_token(LLAMA_3_2_1B, "lora", a, 2048) \
        / model_shape.flops_per_token(LLAMA_3_2_1B, "full", 0, 2048)
    assert 0.65 < ratio < 0.75


def test_warmup_steps_are_the_slow_leading_ones():
    compiled = [40.0, 9.0, 1.0, 1.1, 0.9, 1.0, 1.0, 1.05]  # a recompile on step 2
    assert warmup_count(compiled, compiled=True) == 2
    assert warmup_count(compiled, compiled=False) == 1  # a slow step 2 is noise, not warm-up
    assert warmup_count([1.2, 1.0, 1.0, 1.0], compiled=True) == 1
    assert warmup_count([5.0, 1.0], compiled=True) == 0


def test_summary_reports_steady_speed_apart_from_compile(tmp_path, long_context_model):
    """metrics.jsonl as a compiled run writes it: a 30 s first step (compilation), then
    2048 tokens per 0.1 s."""
    from kubetune.trainer.checkpointing.checkpoint_model import read_checkpoint_model

    lines = []
    for step in range(1, 11):
        tps = 2048 / 30.0 if step == 1 else 20480.0
        lines.append(json.dumps({"step": step, "epoch": 0, "loss": 2.0, "tokens": 2048,
                                 "tokens_per_second": tps, "peak_memory_bytes": 1}))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    cfg = OmegaConf.create({"compile": True, "batch_size": 1, "gradient_accumulation_steps": 1,
                            "dataset": {"packed": True}, "tokenizer": {"max_seq_len": 2048},
                            "model": {"lora_rank": 8, "lora_attn_modules": ["q_proj"]}})
    dims = read_checkpoint_model(long_context_model).architecture.dims
    summary = summarize(tmp_path, 32.0, "completed", dims, "cpu", 1, "epoch_0", "lora", cfg)
    assert summary["tokens_per_second"] == pytest.approx(20480.0)
    assert summary["warmup_steps"] == 1 and summary["warmup_s"] == pytest.approx(30.0)
    assert summary["warmup_excess_s"] == pytest.approx(29.9)
    assert summary["compile"] is True and summary["mfu"] is None  # no GPU peak to divide by
    assert summary["mfu_attention_tokens"] == 2048
    assert summary["mfu_convention"].startswith("4N + 6N_adapter")
    assert summary["mfu_flops_per_token"] == model_shape.flops_per_token(
        dims, "lora", summary["n_adapter_params"], 2048)


def test_a_cpu_lora_run_reports_its_adapter_flops(tmp_path, tiny_model_dir, tiny_dataset_dir):
    """A real run: summary.json counts exactly the adapter parameters torchtune saved, uses
    the LoRA FLOPs convention, and on CPU leaves compile off with one warm-up step."""
    from safetensors import safe_open

    from tests.support.trainer import SHORT

    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    result = tune_run(pvc, "lora_finetune_single_device", "--config",
                      "llama3_2/1B_lora_single_device", *pvc.runtime_args(),
                      *on_pvc(SDK_LORA_ARGS, pvc), *SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = pvc.summary()
    with safe_open(str(pvc.output / "epoch_0" / "adapter_model.safetensors"), "pt") as f:
        saved = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    assert summary["n_adapter_params"] == saved > 0
    assert summary["method"] == "lora" and summary["mfu_convention"].startswith("4N")
    assert summary["mfu_flops_per_token"] < 6 * summary["n_params"] \
        + model_shape.attention_flops_per_token(read_dims(tiny_model_dir),
                                                summary["mfu_attention_tokens"])
    assert summary["compile"] is False and summary["warmup_steps"] == 1
    assert summary["tokens_per_second"] > 0 and summary["mfu"] is None


def read_dims(model_dir) -> dict:
    from kubetune.trainer.checkpointing.checkpoint_model import read_checkpoint_model

    return read_checkpoint_model(model_dir).architecture.dims
