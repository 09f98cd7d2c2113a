"""DPO benchmark: kubetune's `tune run lora_dpo_single_device` vs plain torchtune's, the
same upstream config on the same preference pairs, in one script (bench/trainer.py's
measurement: tokens/s, peak memory of the process tree, start-up to the first step, CPU
seconds; each repeat runs both sides back to back, ratios are medians of per-repeat ratios).

The data is torchtune's own preference shape (``chosen``/``rejected`` message lists, read
by torchtune's ``preference_dataset`` on the plain side and by ours, which the launcher
puts in its place, on ours), so that both sides tokenize and mask the same pairs; whether
they trained the same batches is checked (every step's loss equal to 1e-5: DPO's first
loss is ln 2 whatever the batch), not assumed. Plain torchtune gets what it needs to load
the tiny checkpoint (bench/trainer.py's ``loading_overrides``), ours the user's arguments.

CPU: the tiny Llama-3, fp32. GPU (when CUDA is present): bench/trainer.py's
Llama-3.2-1B-shaped model with random weights, bf16, pairs of about 600 tokens (a paragraph
of context before the question: the lengths preference data has), peak CUDA memory as each
recipe logs it.

    python bench/dpo.py [--steps 8] [--rows 512] [--repeats 3] [--threads N]
                        [--model DIR] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _sft_bench():
    """bench/trainer.py's measurement, loaded by path (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("bench_trainer", REPO / "bench" / "trainer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SFT = _sft_bench()
aggregate, measure_child, recipe_against_plain = (
    _SFT.aggregate, _SFT.measure_child, _SFT.recipe_against_plain)

from kubetune.tools.demo import write_tiny_model  # noqa: E402
from kubetune.tools.plain_torchtune import loading_overrides  # noqa: E402

RECIPE, CONFIG = "lora_dpo_single_device", "llama3_1/8B_lora_dpo_single_device"


def write_pairs(directory: Path, rows: int, context_words: int = 0) -> Path:
    """A sum against a refusal, as torchtune's preference_dataset reads pairs; with
    ``context_words`` words of context before the question (GPU-sized pairs)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "train.jsonl", "w") as out:
        for i in range(rows):
            a, b = i % 97, (i * 7) % 89
            context = " ".join(f"w{(i * 31 + k) % 1000}" for k in range(context_words))
            user = {"role": "user",
                    "content": (context + "\n" if context else "") + f"What is {a}+{b}?"}
            out.write(json.dumps({
                "chosen": [user, {"role": "assistant", "content": str(a + b)}],
                "rejected": [user, {"role": "assistant", "content": "I cannot answer that."}],
            }) + "\n")
    return directory / "train.jsonl"


def run(workdir: Path, model: Path, data: Path, steps: int, threads: int | None,
        gpu: bool = False) -> dict:
    user_args = ["dataset._component_=torchtune.datasets.preference_dataset",
                 "dataset.source=json", f"dataset.data_files={data}", "epochs=1",
                 f"max_steps_per_epoch={steps}", f"batch_size={4 if gpu else 8}",
                 "gradient_accumulation_steps=1", f"dtype={'bf16' if gpu else 'fp32'}",
                 "seed=0", f"checkpointer.checkpoint_dir={model}",
                 f"tokenizer.path={model / 'original' / 'tokenizer.model'}",
                 # The config's 1024 exceeds the tiny model's positions; ours caps it alike.
                 f"tokenizer.max_seq_len={1024 if gpu else 512}",
                 "lr_scheduler.num_warmup_steps=0", "enable_activation_checkpointing=False"]
    result = recipe_against_plain(workdir, RECIPE, CONFIG, user_args, loading_overrides(model),
                                  [], steps, threads, gpu)
    return {"model": "Llama-3.2-1B-shaped" if gpu else "tiny Llama-3", **result}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        sys.exit(measure_child(sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model", type=Path, default=None,
                        help="train this model directory instead of writing one")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kubetune-bench-dpo"))
    args = parser.parse_args()
    gpu = _SFT.cuda_present()
    shutil.rmtree(args.workdir, ignore_errors=True)
    model = args.model or (
        write_tiny_model(args.workdir / "model", _SFT.LLAMA_3_2_1B, device="cuda") if gpu
        else write_tiny_model(args.workdir / "model"))
    data = write_pairs(args.workdir / "pairs", args.rows, context_words=100 if gpu else 0)
    print(json.dumps(aggregate([run(args.workdir, model, data, args.steps, args.threads, gpu)
                                for _ in range(args.repeats)]), indent=2))


if __name__ == "__main__":
    main()
