"""Distillation benchmark: kubetune's `tune run knowledge_distillation_single_device` vs
plain torchtune's, the same upstream config (`llama3_2/8B_to_1B_KD_lora_single_device`)
on the same data, student and teacher, in one script (bench/trainer.py's measurement:
tokens/s, peak memory of the process tree, start-up to the first step, CPU seconds; each
repeat runs both sides back to back, ratios are medians of per-repeat ratios).

The student is the tiny Llama-3, the teacher a deeper one of the same tokenizer. The data
is Alpaca-like input/output rows read by torchtune's ``instruct_dataset`` on both sides,
unpacked (ours would choose a builder and packing where none is named: naming them keeps
the batches the same); whether both trained the same batches is checked (every step's loss equal to 1e-5),
not assumed. Plain torchtune gets what it needs to load the tiny student and teacher
(``loading_overrides``, for the teacher under ``teacher_model``/``teacher_checkpointer``),
ours the user's arguments.

CPU: the tiny Llama-3 student, fp32. GPU (when CUDA is present): bench/trainer.py's
Llama-3.2-1B-shaped student and a Llama-3.2-3B-shaped teacher (random weights, one
tokenizer), bf16, peak CUDA memory as each recipe logs it.

    python bench/distill.py [--steps 8] [--rows 512] [--repeats 3] [--threads N]
                            [--model DIR] [--teacher DIR] [--workdir DIR]
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
from kubetune.tools.demo.alpaca_like import write_alpaca_like  # noqa: E402
from kubetune.tools.demo.tiny_model import TinyModelSpec  # noqa: E402
from kubetune.tools.plain_torchtune import loading_overrides  # noqa: E402

RECIPE, CONFIG = "knowledge_distillation_single_device", "llama3_2/8B_to_1B_KD_lora_single_device"
LLAMA_3_2_3B = TinyModelSpec(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                             num_attention_heads=24, num_key_value_heads=8,
                             max_position_embeddings=131072, vocab_size=128256,
                             tie_word_embeddings=True, torch_dtype="bfloat16", seed=7)


def teacher_overrides(teacher: Path) -> list[str]:
    """What plain torchtune needs to load the teacher: the student's loading overrides,
    full (no LoRA), under the teacher's sections; the tokenizer is the student's."""
    renamed = []
    for arg in loading_overrides(teacher, lora=False):
        if arg.startswith("model."):
            renamed.append("teacher_" + arg)
        elif arg.startswith("checkpointer."):
            renamed.append("teacher_" + arg)
    return [*renamed, f"teacher_checkpointer.checkpoint_dir={teacher}"]


def run(workdir: Path, model: Path, teacher: Path, data: Path, steps: int,
        threads: int | None, gpu: bool = False) -> dict:
    user_args = ["dataset._component_=torchtune.datasets.instruct_dataset",
                 "dataset.source=parquet", f"dataset.data_dir={data / 'data'}",
                 "dataset.split=train", "dataset.packed=False", "epochs=1",
                 f"max_steps_per_epoch={steps}", f"batch_size={4 if gpu else 8}",
                 "gradient_accumulation_steps=1", f"dtype={'bf16' if gpu else 'fp32'}",
                 "seed=0", f"checkpointer.checkpoint_dir={model}",
                 f"tokenizer.path={model / 'original' / 'tokenizer.model'}",
                 "tokenizer.max_seq_len=512", "lr_scheduler.num_warmup_steps=0",
                 "model.lora_rank=8", "model.lora_alpha=16", f"optimizer.fused={gpu}"]
    result = recipe_against_plain(
        workdir, RECIPE, CONFIG, user_args,
        [*loading_overrides(model), *teacher_overrides(teacher)],
        [f"teacher_checkpointer.checkpoint_dir={teacher}"], steps, threads, gpu)
    return {"student": "Llama-3.2-1B-shaped" if gpu else "tiny Llama-3",
            "teacher": "Llama-3.2-3B-shaped" if gpu else "tiny Llama-3, 4 layers", **result}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        sys.exit(measure_child(sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model", type=Path, default=None,
                        help="the student: this model directory instead of writing one")
    parser.add_argument("--teacher", type=Path, default=None,
                        help="the teacher: this model directory instead of writing one")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kubetune-bench-distill"))
    args = parser.parse_args()
    gpu = _SFT.cuda_present()
    device = "cuda" if gpu else "cpu"
    shutil.rmtree(args.workdir, ignore_errors=True)
    model = args.model or write_tiny_model(
        args.workdir / "model", _SFT.LLAMA_3_2_1B if gpu else TinyModelSpec(), device=device)
    teacher = args.teacher or write_tiny_model(
        args.workdir / "teacher", LLAMA_3_2_3B if gpu
        else TinyModelSpec(num_hidden_layers=4, seed=7), device=device)
    write_alpaca_like(args.workdir / "data", args.rows, scale=0.25)
    data = args.workdir / "data"
    print(json.dumps(aggregate([run(args.workdir, model, teacher, data, args.steps,
                                    args.threads, gpu) for _ in range(args.repeats)]),
                     indent=2))


if __name__ == "__main__":
    main()
