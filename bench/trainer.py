"""Trainer benchmark: kubetune's `tune run` vs the upstream-equivalent plain torchtune
`tune run` of the same upstream config on the same data, in one script. Each repeat runs
both sides back to back; the reported ratios are medians of the per-repeat ratios.

Reports, for each: tokens/s (steady state: median over steps after the first, as the
recipe measures them, all devices), peak memory (largest process of the run's tree:
resident memory on CPU; CUDA peak reserved on GPU as the recipe logs it), and the
start-up time from process start to the first finished step. The launcher's overhead is
the difference of start-up times, reported as a fraction of the plain run's start-up.
Ours also reports summary.json's warm-up (compile) seconds and MFU.

CPU seconds too (the process tree's user + system time, read from /proc when the first
and the last step are logged): to the first step, between the first and the last step,
and in all. On a machine shared with other jobs wall-clock rates swing with the
neighbours' load; CPU seconds of the same work move much less (``--threads 1`` steadies
them further: no intra-op threads spinning while a neighbour holds the core). Whether
both sides trained the same batches is checked, not assumed (``same_batches``: the same
step count and first-step loss), and only then is ``tokens_per_cpu_s_ours_over_plain``
(plain's steady CPU seconds over ours) reported: the same tokens in less CPU time.

The plain run gets only what upstream torchtune needs to run this checkpoint at all
(the model's real dimensions, tokenizer and checkpoint paths, device and dtype); our
launcher gets the upstream config name and the user's arguments, as Kubeflow Trainer
sends them, and adds its own choices (defaults, checks, metrics, stop/resume guard).

Data (``--data``):
  tiny       the two-digit addition set, one parquet file (the default);
  realistic  alpaca-like rows (~287 tokens; ``kubetune.tools.demo.alpaca_like``) in
             ``--shards`` parquet files, the user's arguments being the Kubeflow SDK's
             LoRA arguments: ours applies its defaults (on CUDA: packing across shards,
             compile and a memory plan; on CPU none of these change what is computed);
             plain stays unpacked, as upstream does.
Command shape (``--shape``):
  single     ``tune run lora_finetune_single_device --config llama3_2/1B_lora_single_device``
  kubeflow   ``tune run --nnodes 1 --nproc_per_node 1 lora_finetune_distributed --config
             llama3_2/1B_lora``, as the controller composes it (upstream's `tune`
             runs it through torchrun; ours starts the one process itself). Plain
             torchtune's distributed recipe needs CUDA; on CPU its baseline is the plain
             single-device recipe on the same data (said in the output).
  both       each of the above.

Method (``--method``): lora (the default), qlora (LoRA's arguments and
``model.quantize_base=True``, as the SDK sends QLoRA; on a single device the QLoRA config)
or full (no adapter arguments; the full fine-tuning recipe and config).

CPU: the tiny Llama-3 (for QLoRA one whose projections NF4's blocks divide). GPU (when
CUDA is present): a Llama-3.2-1B-shaped model with random weights (``--model-size 8B``: a
Llama-3.1-8B-shaped one, with llama3_1's configs), bf16, and MFU from summary.json.
``--model``/``--dataset`` reuse a model and realistic data written once (bench/gpu.py).

    python bench/trainer.py [--data tiny|realistic] [--shape single|kubeflow|both]
                            [--method lora|qlora|full] [--model-size 1B|8B]
                            [--steps 20] [--rows 4096] [--shards 4] [--threads N]
                            [--repeats 3] [--model DIR] [--dataset DIR] [--workdir DIR]
                            [--no-plan-timing]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubetune.tools.demo import TinyModelSpec, write_tiny_dataset, write_tiny_model  # noqa: E402
from kubetune.tools.demo.alpaca_like import write_alpaca_like  # noqa: E402
from kubetune.tools.plain_torchtune import loading_overrides  # noqa: E402

LLAMA_3_2_1B = TinyModelSpec(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                             num_attention_heads=32, num_key_value_heads=8,
                             max_position_embeddings=131072, vocab_size=128256,
                             tie_word_embeddings=True, torch_dtype="bfloat16")
# What the Kubeflow SDK sends for TorchTuneConfig(dtype=BF16, batch_size=4, epochs=1,
# peft_config=LoraConfig(...), dataset_preprocess_config=TorchTuneInstructDataset(parquet))
# (tests/test_trainer_runs.py checks the SDK still does); data_dir is set per run.
SDK_LORA_ARGS = ["batch_size=4", "epochs=1", "model.apply_lora_to_mlp=True",
                 "model.lora_rank=8", "model.lora_alpha=16", "model.lora_dropout=0.1",
                 "model.lora_attn_modules=[q_proj,v_proj,output_proj]",
                 "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
                 "dataset.split=train", "dataset.train_on_input=False"]
LLAMA_3_1_8B = TinyModelSpec(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8,
                             max_position_embeddings=131072, vocab_size=128256,
                             torch_dtype="bfloat16")
# The shapes on a GPU (``--model-size``): the spec and the config family torchtune names it by.
GPU_MODELS = {"1B": (LLAMA_3_2_1B, "llama3_2"), "8B": (LLAMA_3_1_8B, "llama3_1")}
# NF4 quantizes in blocks of 64 x 256 elements: the tiny model's projections are not
# multiples, this one's are (tests/test_trainer_runs.py's QLoRA run uses it too).
TINY_NF4 = TinyModelSpec(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                         num_key_value_heads=4, max_position_embeddings=8192)
# (torchrun arguments, recipe, config suffix) per command shape and method.
SHAPES = {
    ("single", "lora"): ([], "lora_finetune_single_device", "lora_single_device"),
    ("single", "qlora"): ([], "lora_finetune_single_device", "qlora_single_device"),
    ("single", "full"): ([], "full_finetune_single_device", "full_single_device"),
    ("kubeflow", "lora"): (["--nnodes", "1", "--nproc_per_node", "1"],
                           "lora_finetune_distributed", "lora"),
    # The distributed LoRA config with quantize_base (the SDK's QLoRA argument), as on
    # several GPUs. With torch 2.13 and torchao 0.15 its NF4 weights fail under FSDP2
    # (nf4tensor's fsdp_post_all_gather: "not enough values to unpack"); bench/gpu.py's
    # QLoRA case runs the single-device recipe the controller picks for one GPU.
    ("kubeflow", "qlora"): (["--nnodes", "1", "--nproc_per_node", "1"],
                            "lora_finetune_distributed", "lora"),
    ("kubeflow", "full"): (["--nnodes", "1", "--nproc_per_node", "1"],
                           "full_finetune_distributed", "full"),
}


def shape_command(shape: str, method: str, size: str = "1B") -> tuple[list[str], str, str]:
    """(torchrun arguments, recipe, config) of ``shape`` for ``method`` on a ``size`` model."""
    torchrun, recipe, suffix = SHAPES[(shape, method)]
    return torchrun, recipe, f"{GPU_MODELS[size][1]}/{size}_{suffix}"


def sdk_args(method: str) -> list[str]:
    """The SDK's arguments for ``method``: LoRA's, QLoRA's (LoRA's and the quantized base),
    or full fine-tuning's (no adapter settings)."""
    if method == "full":
        return [a for a in SDK_LORA_ARGS if not a.startswith("model.")]
    return [*SDK_LORA_ARGS, *(["model.quantize_base=True"] if method == "qlora" else [])]


_TICKS = os.sysconf("SC_CLK_TCK")


def cuda_present() -> bool:
    """Whether the runs train on a GPU, probed as the trainer probes it: without importing
    torch (seconds per bench process, which --cpu-smoke runs many of)."""
    from kubetune.trainer.performance.hardware import visible_gpus

    return bool(visible_gpus())


def tree_cpu_s(root: int) -> float:
    """User + system seconds of ``root`` and every process below it, the ended ones its
    members waited for included (their ``cutime``/``cstime``)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(f) for f in fields[11:15]) / _TICKS
    tree, grew = {root}, True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= below
        grew = bool(below)
    return sum(times.get(pid, 0.0) for pid in tree)


def measured(command: list[str], env: dict, log: Path, steps_logged: callable,
             steps: int) -> dict:
    """Run ``command`` via a wrapper that reports its tree's peak RSS and CPU seconds;
    time the first step, and read the tree's CPU seconds at the first and the last."""
    wrapper = [sys.executable, __file__, "--measure", "--", *command]
    start = time.monotonic()
    with open(log, "w") as out:
        child = subprocess.Popen(wrapper, env=env, cwd=REPO, stdout=out,
                                 stderr=subprocess.STDOUT)
        first = first_cpu = last_cpu = None
        while child.poll() is None:
            if last_cpu is None:
                logged = steps_logged()
                if first is None and logged >= 1:
                    first, first_cpu = time.monotonic() - start, tree_cpu_s(child.pid)
                if logged >= steps:
                    last_cpu = tree_cpu_s(child.pid)
            time.sleep(0.05)
    if child.returncode != 0:
        raise SystemExit(f"{command[:4]} failed ({child.returncode}): see {log}")
    text = log.read_text()
    peak = int(re.findall(r"^kubetune-bench-peak-rss (\d+)$", text, re.M)[-1])
    cpu = float(re.findall(r"^kubetune-bench-cpu-s (\S+)$", text, re.M)[-1])
    return {"first_step_s": first, "wall_s": time.monotonic() - start, "peak_rss": peak,
            "cpu_s_to_first_step": first_cpu, "cpu_s": cpu,
            # None when the run logged fewer steps than asked (a short epoch).
            "cpu_s_steady": None if last_cpu is None or first_cpu is None
            else last_cpu - first_cpu}


def plain_metrics(log_dir: Path) -> list[dict]:
    records = []
    for path in sorted(log_dir.glob("log_*.txt")):
        for line in path.read_text().splitlines():
            m = re.match(r"Step (\d+) \| (.*)", line)
            if m:
                fields = dict(kv.split(":", 1) for kv in m.group(2).split())
                records.append({"step": int(m.group(1)),
                                **{k: float(v) for k, v in fields.items()}})
    return [r for r in records if "loss" in r]


def same_batches(plain: list[dict], ours: list[dict]) -> bool:
    """Whether both sides trained the same batches: as many steps, and the first step's
    loss equal to 1e-6 (fp32, same weights; another batch shape, packing or order moves it
    by 1e-4 or more). Later steps' losses drift apart by up to ~1e-4 when the recipes
    differ (the distributed recipe's sharded numerics against the single-device stand-in)
    although the batches, drawn by the same seeded sampler from the same data, are the
    same."""
    if not plain or len(plain) != len(ours):
        return False
    first_plain, first_ours = plain[0]["loss"], ours[0]["loss"]
    return abs(first_plain - first_ours) <= 1e-6 * abs(first_plain)


def median_tps(records: list[dict], key: str, world: int) -> float:
    # Median, not mean: on a shared machine single steps stall when a neighbour runs.
    timed = sorted(r[key] for r in (records[1:] if len(records) > 2 else records))
    return timed[len(timed) // 2] * world


def model_spec(gpu: bool, data: str, method: str = "lora", size: str = "1B") -> TinyModelSpec:
    """The model a run trains: ``size``-shaped on a GPU, else the tiny Llama-3 (NF4-sized
    for QLoRA)."""
    if gpu:
        return GPU_MODELS[size][0]
    if method == "qlora":
        return TINY_NF4
    # Realistic rows pack into 2048-token sequences, and plain torchtune does not truncate
    # (max_seq_len null): the tiny model needs the positions.
    return TinyModelSpec(max_position_embeddings=8192 if data == "realistic" else 512)


def prepare(workdir: Path, rows: int, gpu: bool, data: str, shards: int, method: str = "lora",
            size: str = "1B", model: Path | None = None,
            dataset: Path | None = None) -> tuple[Path, Path]:
    """The model and data of the runs: ``model``/``dataset`` where given (written once for
    several benches, as bench/gpu.py does), else written under ``workdir``."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    if model is None:
        model = write_tiny_model(workdir / "model", model_spec(gpu, data, method, size),
                                 device="cuda" if gpu else "cpu")
    if dataset is not None:
        return model, dataset
    if data == "realistic":
        # Both models use the tiny byte-level tokenizer: a quarter of Alpaca's words makes
        # Alpaca's ~287 tokens per row (our packing estimate then sees shorter rows).
        write_alpaca_like(workdir / "dataset", rows, shards, "parquet", scale=0.25)
        return model, workdir / "dataset"
    return model, write_tiny_dataset(workdir / "dataset", rows=rows)


def run(workdir: Path, model: Path, dataset: Path, steps: int, batch: int | None, gpu: bool,
        data: str, shape: str, accumulation: int | None = None,
        threads: int | None = None, method: str = "lora", size: str = "1B",
        plan_timed: bool = True) -> dict:
    for side in ("plain", "ours"):
        shutil.rmtree(workdir / side, ignore_errors=True)
    device, dtype = ("cuda", "bf16") if gpu else ("cpu", "fp32")
    torchrun, recipe, config = shape_command(shape, method, size)
    data_args = [f"dataset.data_dir={dataset / 'data'}", f"max_steps_per_epoch={steps}",
                 f"dtype={dtype}", "seed=0", f"checkpointer.checkpoint_dir={model}",
                 f"tokenizer.path={model / 'original' / 'tokenizer.model'}"]
    if data == "realistic":
        user_args = [*sdk_args(method), *data_args]
        if batch:
            user_args.append(f"batch_size={batch}")
        if accumulation:
            user_args.append(f"gradient_accumulation_steps={accumulation}")
    else:
        user_args = [*data_args, "dataset=torchtune.datasets.instruct_dataset",
                     "dataset.source=parquet", "epochs=1", f"batch_size={batch}",
                     f"gradient_accumulation_steps={accumulation or 1}"]
        if gpu:
            # Full 2048-token sequences, every token trained on: the work a GPU is sized
            # for, and what tokens/s (which counts trained tokens) and MFU should measure.
            user_args += ["dataset.packed=True", "tokenizer.max_seq_len=2048",
                          "dataset.train_on_input=True"]
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("KUBETUNE_")}
    env["TQDM_DISABLE"] = "1"
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)

    # Plain torchtune: the same upstream config, with what it needs to load this
    # checkpoint; unpacked and uncompiled unless the arguments say otherwise, as upstream.
    # Its distributed recipe opens NCCL groups: on CPU the single-device one stands in.
    plain_torchrun, plain_recipe, plain_config = shape_command(shape if gpu else "single",
                                                               method, size)
    plain_out = workdir / "plain"
    plain_args = [*user_args, f"output_dir={plain_out}", f"device={device}",
                  *loading_overrides(model, lora=method != "full"),
                  "metric_logger._component_=torchtune.training.metric_logging.DiskLogger",
                  f"metric_logger.log_dir={plain_out / 'logs'}",
                  f"log_peak_memory_stats={gpu}", f"optimizer.fused={gpu}"]
    if plain_config != config:
        plain_args += stand_in_args(config, plain_config, method, accumulation)
    plain_cmd = [sys.executable, "-m", "torchtune._cli.tune", "run", *plain_torchrun,
                 plain_recipe, "--config", plain_config, *plain_args]
    plain = measured(plain_cmd, env, workdir / "plain.log",
                     lambda: len(plain_metrics(plain_out / "logs")), steps)
    plain_records = plain_metrics(plain_out / "logs")
    drop_checkpoints(plain_out)

    ours_out = workdir / "ours"
    ours_cmd = [sys.executable, "-m", "kubetune.entrypoints.tune", "run", *torchrun, recipe, "--config",
                config, f"output_dir={ours_out}", *user_args]
    metrics = ours_out / "metrics.jsonl"
    ours = measured(ours_cmd, env, workdir / "ours.log",
                    lambda: metrics.read_text().count('"loss"') if metrics.is_file() else 0,
                    steps)
    ours_records = [r for r in (json.loads(line) for line in metrics.read_text().splitlines())
                    if "loss" in r]
    summary = json.loads((ours_out / "summary.json").read_text())

    # The launcher's own work before it starts the recipe: a dry run plans everything.
    plan_s, decisions = plan_timing(ours_cmd, env) if plan_timed else (None, [])
    matched = same_batches(plain_records, ours_records)
    result = {
        "device": device, "cpu_threads": threads or "torch's default",
        "model": f"Llama-{size}-shaped" if gpu else "tiny Llama-3", "method": method,
        "data": data, "shape": shape, "steps": steps,
        "plain": {**plain, "command": " ".join(["tune run", *plain_torchrun, plain_recipe,
                                                "--config", plain_config]),
                  "tokens_per_s": median_tps(plain_records, "tokens_per_second_per_gpu", 1)},
        "ours": {**ours, "command": " ".join(["tune run", *torchrun, recipe, "--config",
                                              config]),
                 "tokens_per_s": median_tps(ours_records, "tokens_per_second", 1),
                 "mfu": summary.get("mfu"), "warmup_s": summary.get("warmup_s"),
                 "launcher_plan_s": plan_s, "decisions": decisions},
        "same_batches": matched,
    }
    if gpu:
        result["plain"]["peak_cuda_reserved_gib"] = max(
            r.get("peak_memory_reserved", 0) for r in plain_records)
        result["ours"]["peak_cuda_reserved_gib"] = max(
            r.get("peak_memory_bytes", 0) for r in ours_records) / 1024 ** 3
    result["ratios"] = ratios(result["plain"], result["ours"], matched)
    return result


def plan_timing(ours_cmd: list[str], env: dict) -> tuple[float, list[str]]:
    """Seconds of the launcher's dry run (its plan, without the recipe) and the speed
    decisions it notes."""
    plan_start = time.monotonic()
    dry = subprocess.run([*ours_cmd, "--kubetune-dry-run"], env=env, cwd=REPO, check=True,
                         capture_output=True, text=True)
    return time.monotonic() - plan_start, [line[6:] for line in dry.stdout.splitlines()
                                           if line.startswith("note: speed:")]


def config_value(config: str, key: str):
    """``key`` of torchtune's shipped config ``config`` (read, not imported)."""
    import importlib.util

    import yaml

    recipes = list(importlib.util.find_spec("recipes").submodule_search_locations)[0]
    return yaml.safe_load((Path(recipes) / "configs" / f"{config}.yaml").read_text()).get(key)


def stand_in_args(config: str, plain_config: str, method: str,
                  accumulation: int | None) -> list[str]:
    """What the single-device config standing in for the distributed one on CPU needs to
    train the same batches: the distributed config's accumulation where the user set none
    (full fine-tuning's single-device config has 1, its distributed one 8) and, for full
    fine-tuning, the distributed config's AdamW (the single-device config's optimizer is
    bitsandbytes', a CUDA package, stepped in the backward pass, which takes no
    accumulation)."""
    args = []
    if accumulation is None:
        steps = config_value(config, "gradient_accumulation_steps")
        args.append(f"gradient_accumulation_steps={steps}")
    if method == "full":
        args += ["optimizer._component_=torch.optim.AdamW", "optimizer_in_bwd=False"]
    return args


def drop_checkpoints(output_dir: Path) -> None:
    """Remove a finished run's saved weights, its logs kept: an 8B-shaped run saves 16 GB,
    and the other side's run must find the disk it needs."""
    for path in output_dir.iterdir():
        if path.name != "logs":
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def ratios(p: dict, o: dict, matched: bool) -> dict:
    steady = matched and p["cpu_s_steady"] and o["cpu_s_steady"]
    return {
        "tokens_per_s_ours_over_plain": o["tokens_per_s"] / p["tokens_per_s"],
        "tokens_per_cpu_s_ours_over_plain": p["cpu_s_steady"] / o["cpu_s_steady"]
        if steady else None,
        "startup_cpu_s_ours_minus_plain": o["cpu_s_to_first_step"] - p["cpu_s_to_first_step"],
        "cpu_s_ours_over_plain": o["cpu_s"] / p["cpu_s"],
        "peak_rss_ours_over_plain": o["peak_rss"] / p["peak_rss"],
        "startup_overhead_s": o["first_step_s"] - p["first_step_s"],
        "startup_overhead_fraction_of_plain": (o["first_step_s"] - p["first_step_s"])
        / p["first_step_s"],
        "launcher_plan_fraction_of_plain_startup": o["launcher_plan_s"] / p["first_step_s"]
        if o["launcher_plan_s"] is not None else None,
    }


def recipe_against_plain(workdir: Path, recipe: str, config: str, user_args: list[str],
                         plain_args: list[str], ours_args: list[str], steps: int,
                         threads: int | None, gpu: bool) -> dict:
    """One repeat of an objective's recipe (bench/dpo.py, bench/distill.py): plain
    torchtune's `tune run` with ``plain_args`` (what it needs to load the checkpoints),
    then ours with ``ours_args``, both with the user's ``user_args``; whether they trained
    the same batches is every step's loss equal to 1e-5."""
    for side in ("plain", "ours"):
        shutil.rmtree(workdir / side, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBETUNE_")}
    env["TQDM_DISABLE"] = "1"
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    plain_out = workdir / "plain"
    plain_cmd = [sys.executable, "-m", "torchtune._cli.tune", "run", recipe, "--config",
                 config, *user_args, f"output_dir={plain_out}",
                 f"device={'cuda' if gpu else 'cpu'}", *plain_args,
                 "metric_logger._component_=torchtune.training.metric_logging.DiskLogger",
                 f"metric_logger.log_dir={plain_out / 'logs'}", f"log_peak_memory_stats={gpu}"]
    plain = measured(plain_cmd, env, workdir / "plain.log",
                     lambda: len(plain_metrics(plain_out / "logs")), steps)
    plain_records = plain_metrics(plain_out / "logs")
    drop_checkpoints(plain_out)
    ours_out = workdir / "ours"
    ours_cmd = [sys.executable, "-m", "kubetune.entrypoints.tune", "run", recipe, "--config",
                config, f"output_dir={ours_out}", *user_args, *ours_args]
    metrics = ours_out / "metrics.jsonl"
    ours = measured(ours_cmd, env, workdir / "ours.log",
                    lambda: metrics.read_text().count('"loss"') if metrics.is_file() else 0,
                    steps)
    ours_records = [r for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r]
    matched = len(plain_records) == len(ours_records) > 1 and all(
        abs(p["loss"] - o["loss"]) <= 1e-5 for p, o in zip(plain_records, ours_records))
    plain["tokens_per_s"] = median_tps(plain_records, "tokens_per_second_per_gpu", 1)
    ours["tokens_per_s"] = median_tps(ours_records, "tokens_per_second", 1)
    steady = matched and plain["cpu_s_steady"] and ours["cpu_s_steady"]
    memory = {}
    if gpu:
        memory = {"peak_cuda_reserved_gib_ours_over_plain": max(
            r.get("peak_memory_bytes", 0) for r in ours_records) / 1024 ** 3 / max(
            r.get("peak_memory_reserved", 0) for r in plain_records)}
    return {"device": "cuda" if gpu else "cpu", "recipe": recipe, "config": config,
            "steps": steps, "plain": plain, "ours": ours, "same_batches": matched,
            "ratios": {
                "tokens_per_s_ours_over_plain": ours["tokens_per_s"] / plain["tokens_per_s"],
                "tokens_per_cpu_s_ours_over_plain": plain["cpu_s_steady"]
                / ours["cpu_s_steady"] if steady else None,
                "peak_rss_ours_over_plain": ours["peak_rss"] / plain["peak_rss"],
                "startup_overhead_s": ours["first_step_s"] - plain["first_step_s"],
                **memory}}


def measure_child(command: list[str]) -> int:
    code = subprocess.call(command)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"kubetune-bench-peak-rss {usage.ru_maxrss * 1024}", flush=True)
    print(f"kubetune-bench-cpu-s {usage.ru_utime + usage.ru_stime:.3f}", flush=True)
    return code


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        sys.exit(measure_child(sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("tiny", "realistic"), default="tiny")
    parser.add_argument("--shape", choices=("single", "kubeflow", "both"), default="single")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--shards", type=int, default=4, help="realistic data: parquet files")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="default: 32 on CPU (tiny samples), 4 packed sequences on GPU; "
                             "realistic data: the SDK's 4")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=None,
                        help="default: 1 on tiny data; realistic data: the config's (8)")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP_NUM_THREADS for both sides (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="alternating runs of each side; medians are reported")
    parser.add_argument("--method", choices=("lora", "qlora", "full"), default="lora",
                        help="the SDK's arguments for this method, its recipe and config")
    parser.add_argument("--model-size", choices=tuple(GPU_MODELS), default="1B",
                        help="GPU: the Llama shape to train (CPU: the tiny Llama-3)")
    parser.add_argument("--model", type=Path, default=None,
                        help="train this model directory instead of writing one")
    parser.add_argument("--dataset", type=Path, default=None,
                        help="realistic data already written (its data/ folder's parquet "
                             "shards) instead of writing it")
    parser.add_argument("--no-plan-timing", action="store_true",
                        help="skip timing the launcher's plan (a dry run of ours)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kubetune-bench-trainer"))
    args = parser.parse_args()
    gpu = cuda_present()
    rows = args.rows if not gpu else max(args.rows, 65536)
    batch = args.batch_size or (None if args.data == "realistic" else 4 if gpu else 32)
    model, dataset = prepare(args.workdir, rows, gpu, args.data, args.shards, args.method,
                             args.model_size, args.model, args.dataset)
    shapes = ("single", "kubeflow") if args.shape == "both" else (args.shape,)
    results = [aggregate([run(args.workdir, model, dataset, args.steps, batch, gpu,
                              args.data, shape, args.gradient_accumulation_steps,
                              args.threads, args.method, args.model_size,
                              not args.no_plan_timing)
                          for _ in range(args.repeats)])
               for shape in shapes]
    print(json.dumps(results[0] if len(results) == 1 else results, indent=2))


def aggregate(runs: list[dict]) -> dict:
    per_run = [dict(each["ratios"]) for each in runs]
    for each in per_run:
        print(json.dumps(each), file=sys.stderr)
    result = runs[0]
    for side in ("plain", "ours"):
        for key in result[side]:
            values = sorted(r[side][key] for r in runs if isinstance(r[side][key], (int, float)))
            if values:
                result[side][key] = values[len(values) // 2]
    result["repeats"] = len(runs)
    result["same_batches"] = all(r["same_batches"] for r in runs)
    # Paired: each run's ratio is taken between two runs seconds apart, so a neighbour's
    # load shifts both; the median of those ratios is the figure to quote.
    measured = {key: sorted(r[key] for r in per_run if r[key] is not None)
                for key in per_run[0]}
    result["ratios"] = {key: values[len(values) // 2] if values else None
                        for key, values in measured.items()}
    result["ratio_ranges"] = {key: [values[0], values[-1]] if values else None
                              for key, values in measured.items()}
    return result

if __name__ == "__main__":
    main()
