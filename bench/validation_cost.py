"""What validation costs a run (issue 42 §2: at the default frequency, about 5% at most).

The same LoRA run of the embedded tiny Llama-3 on alpaca-like rows (``--rows`` training
rows, one epoch, batch ``--batch``), twice, back to back in each repeat: without a
held-out set, and with one of ``--val-rows`` other rows (``dataset_val``) at the default
frequency (``run_val_every_n_steps`` unset: about ten evaluations per run, the base and
each epoch's end included). Both runs train the same steps on the same batches (checked:
the same step count and losses), so the difference between them is validation's.

CPU: the tiny Llama-3, fp32. GPU (when CUDA is present): a Llama-3.2-1B-shaped model
with random weights (or ``--model``), bf16, the trainer's CUDA defaults (packing, compile).
Validation's share of the validated run's time between its first and last step is
``1 - plain span / validated span`` (the spans leave out start-up, where a second run
finds the first's compiled kernels cached, and the base evaluation, reported apart).

Reported per repeat, and as the median ratio: the span from the first logged step to the
last (``time_s`` in metrics.jsonl; the base evaluation comes before the first step and is
left out of it, so it is reported apart as ``base_eval_s``: the time to the first step
with validation minus without), and the whole run's wall time (``summary.json``). The
cost grows with the held-out set's share of the training tokens: ten forward passes over
it against one forward and backward pass over the training rows per epoch.

    python bench/validation_cost.py [--rows 4000] [--val-rows 80] [--batch 8]
                                    [--repeats 1] [--threads 1] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _sft_bench():
    """bench/trainer.py (its GPU probe and 1B shape), loaded by path: bench/ is no package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_trainer", REPO / "bench" / "trainer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(workdir: Path, name: str, args: argparse.Namespace, validated: bool) -> dict:
    root = workdir / name
    root.mkdir()
    (root / "model").symlink_to(workdir / "model")
    (root / "dataset").symlink_to(workdir / "train")
    output = root / "output"
    overrides = [
        f"output_dir={output}", f"tokenizer.path={root / 'model/original/tokenizer.model'}",
        f"checkpointer.checkpoint_dir={root / 'model'}",
        "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
        f"dataset.data_dir={root / 'dataset/data'}", "epochs=1", f"batch_size={args.batch}",
        "gradient_accumulation_steps=1", "seed=0", f"dtype={args.dtype}"]
    if validated:
        overrides += ["dataset_val._component_=torchtune.datasets.instruct_dataset",
                      "dataset_val.source=parquet", f"dataset_val.data_dir={workdir / 'val/data'}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETUNE_", "PET_"))}
    env.update(KUBETUNE_WORKSPACE=str(root), OMP_NUM_THREADS=str(args.threads))
    done = subprocess.run([sys.executable, "-m", "kubetune.entrypoints.tune", "run",
                           "lora_finetune_single_device", "--config",
                           "llama3_2/1B_lora_single_device", *overrides],
                          env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "loss" in m]
    return {"losses": [m["loss"] for m in steps],
            "first_step_s": steps[0]["time_s"], "span_s": steps[-1]["time_s"] - steps[0]["time_s"],
            "wall_s": json.loads((output / "summary.json").read_text())["wall_time_s"],
            "evaluations": sum(1 for m in lines if "val_loss" in m)}


def same_steps(plain: list[float], validated: list[float], exact: bool) -> None:
    """Both runs trained the same steps on the same batches: the same losses in fp32; in
    bf16 on a GPU, whose kernels need not sum in one order, the same count and first loss
    to 1e-2 (another batch moves it by more)."""
    assert len(plain) == len(validated), "validation changed the number of steps"
    if exact:
        assert plain == validated, "validation changed the training"
    else:
        assert abs(plain[0] - validated[0]) <= 1e-2 * abs(plain[0]), \
            "validation changed the first batch"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--val-rows", type=int, default=80)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", type=Path, default=None,
                        help="train this model directory instead of writing one (GPU: a "
                             "Llama-3.2-1B-shaped one is written, bf16)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from kubetune.tools.demo import write_tiny_model
    from kubetune.tools.demo.alpaca_like import write_alpaca_like

    sft_bench = _sft_bench()
    gpu = sft_bench.cuda_present()
    args.dtype = "bf16" if gpu else "fp32"
    results = []
    with tempfile.TemporaryDirectory(prefix="kubetune-bench-val-") as tmp:
        workdir = Path(tmp)
        if args.model:
            (workdir / "model").symlink_to(args.model.resolve())
        elif gpu:
            write_tiny_model(workdir / "model", sft_bench.LLAMA_3_2_1B, device="cuda")
        else:
            write_tiny_model(workdir / "model")
        write_alpaca_like(workdir / "train", args.rows, scale=0.25)
        write_alpaca_like(workdir / "val", args.val_rows, seed=1, scale=0.25)
        for repeat in range(args.repeats):
            plain = run(workdir, f"plain-{repeat}", args, validated=False)
            validated = run(workdir, f"validated-{repeat}", args, validated=True)
            same_steps(plain["losses"], validated["losses"], exact=args.dtype == "fp32")
            results.append({
                "steps": len(plain["losses"]), "evaluations": validated["evaluations"],
                "validation_share": round(1 - plain["span_s"] / validated["span_s"], 4),
                "span_s": [round(plain["span_s"], 2), round(validated["span_s"], 2)],
                "base_eval_s": round(validated["first_step_s"] - plain["first_step_s"], 2),
                "span_ratio": round(validated["span_s"] / plain["span_s"], 4),
                "wall_ratio": round(validated["wall_s"] / plain["wall_s"], 4)})
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps({
        "rows": args.rows, "val_rows": args.val_rows, "batch": args.batch, "dtype": args.dtype,
        "evaluations": [r["evaluations"] for r in results],
        "median_validation_share": statistics.median(r["validation_share"] for r in results),
        "median_span_ratio": statistics.median(r["span_ratio"] for r in results),
        "median_wall_ratio": statistics.median(r["wall_ratio"] for r in results)}))


if __name__ == "__main__":
    main()
