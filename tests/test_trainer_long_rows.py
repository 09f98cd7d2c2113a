"""Rows longer than the context (issue 32, part 1): a run on such data trains, or stops
with the right diagnosis, never "diverged, lower the learning rate".

Alpaca-like rows where a share of the prompts (a pasted document) is longer than
``tokenizer.max_seq_len=512``: cut to the context, such a row keeps no answer, so it has
nothing to train on. Such rows are dropped before training with one line saying how many
and what to change; with none left the run is refused (exit 65) naming ``max_seq_len``; a
micro-batch with nothing to train on (data the token cache leaves as built) adds nothing
to its step; and a loss that is not finite before any update blames the model or the data,
not the learning rate.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from kubetune.tools.demo.alpaca_like import write_alpaca_like
from tests.support.cli import REPO, clean_env, error_lines, kubetune

pytestmark = pytest.mark.slow

CONTEXT = ["tokenizer.max_seq_len=512", "dataset.packed=False", "dtype=fp32"]


def train(model: Path, dataset: Path, root: Path, *args: str,
          **env: str) -> subprocess.CompletedProcess:
    env.setdefault("KUBETUNE_TOKEN_CACHE_DIR", str(root / "cache"))  # this test's own
    return kubetune("train", "--model-dir", str(model), "--dataset-dir", str(dataset),
                    "--output-dir", str(root / "output"), "--epochs", "1",
                    "--gradient-accumulation-steps", "1", *CONTEXT, *args,
                    env=clean_env(KUBETUNE_TERMINATION_LOG=str(root / "termination-log"),
                                  **env))


def losses(output: Path) -> list[dict]:
    return [m for m in map(json.loads, (output / "metrics.jsonl").read_text().splitlines())
            if "loss" in m]


def finite_weights(path: Path) -> bool:
    import torch

    return all(bool(t.isfinite().all()) for t in torch.load(path, weights_only=True).values())


def test_half_the_prompts_longer_than_the_context_train_on_the_others(tiny_model_dir,
                                                                     tmp_path):
    data = tmp_path / "dataset"
    # 38 of the 80 prompts are long; shuffled into batches of 4, the 4th batch holds only
    # long ones (with them trained on, its loss was 0/0: "training diverged" at step 4).
    write_alpaca_like(data, 80, 2, scale=0.25, long_prompts=0.55, long_chars=700)
    # A cache directory the trainer cannot write (a path under a file): one warning, and
    # the run goes on as it would with it.
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    result = train(tiny_model_dir, data, tmp_path, "--batch-size", "4",
                   KUBETUNE_TOKEN_CACHE_DIR=str(blocked / "cache"))
    assert result.returncode == 0, result.stderr[-3000:]
    [dropped] = [line for line in result.stderr.splitlines() if "train: dropped" in line]
    said = re.search(r"train: dropped (\d+) of 80 rows with no token to train on after "
                     r"truncation to tokenizer\.max_seq_len=512", dropped)
    assert said, dropped
    kept = 80 - int(said.group(1))
    assert kept == 42, dropped
    assert "raise tokenizer.max_seq_len or set dataset.train_on_input=True" in dropped
    steps = losses(tmp_path / "output")
    assert len(steps) == kept // 4 and all(math.isfinite(m["loss"]) for m in steps)
    [warning] = [line for line in result.stderr.splitlines() if "token cache:" in line
                 and "WARNING" in line]
    assert f"{blocked / 'cache'} cannot hold it (Not a directory)" in warning


def test_rows_all_longer_than_the_context_are_refused_naming_max_seq_len(tiny_model_dir,
                                                                         tmp_path):
    data = tmp_path / "dataset"
    write_alpaca_like(data, 50, 1, scale=0.25, long_prompts=1.0, long_chars=700)
    result = train(tiny_model_dir, data, tmp_path, "--batch-size", "4")
    assert result.returncode == 65, result.stderr[-3000:]
    [line] = error_lines(result)
    assert line == ("error: trainer: none of the 50 rows has a token to train on after "
                    "truncation to tokenizer.max_seq_len=512: every prompt fills it, leaving "
                    "no answer; raise tokenizer.max_seq_len or set dataset.train_on_input=True")
    assert (tmp_path / "termination-log").read_text().strip() == line.removeprefix("error: ")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "output" / "kubetune-complete.json").exists()


def _rows(path: Path, long_at: set[int], count: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    document = "A pasted document, far longer than the context. " * 20  # ~1000 tokens
    rows = [{"input": (document if i in long_at else f"What is {i} plus {i}?"),
             "output": f"{2 * i}."} for i in range(count)]
    (path / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), path / "data" / "train.parquet")
    return path


def test_a_micro_batch_with_nothing_to_train_on_adds_nothing(tiny_model_dir, tmp_path):
    # A builder whose rows carry an extra key: the token cache leaves it as built, so its
    # rows with no answer left reach the loss. In order, one row per micro-batch, two per
    # step: steps 1 and 3 start with such a micro-batch, step 4 has only such ones.
    data = _rows(tmp_path / "dataset", long_at={0, 4, 6, 7}, count=8)
    result = train(tiny_model_dir, data, tmp_path, "--batch-size", "1",
                   "--gradient-accumulation-steps", "2", "shuffle=False",
                   "dataset._component_=tests.support.dataset_builders.tagged_rows",
                   # The steps import nothing from the working directory (python -P): a
                   # builder of one's own comes through PYTHONPATH, as in a pod.
                   PYTHONPATH=str(REPO))
    assert result.returncode == 0, result.stderr[-3000:]
    steps = losses(tmp_path / "output")
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    assert all(math.isfinite(m["loss"]) and m["tokens"] > 0 for m in steps[:3]), steps
    assert steps[3]["tokens"] == 0
    assert "step 4 had no token to train on" in result.stderr
    assert finite_weights(tmp_path / "output" / "epoch_0" / "adapter_model.pt")


def test_a_loss_not_finite_before_any_update_is_not_blamed_on_the_learning_rate(
        model_copy, tiny_dataset_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    [weights] = model_copy.glob("*.safetensors")
    tensors = load_file(str(weights))
    name = next(n for n in tensors if "embed_tokens" in n)
    tensors[name][:] = float("nan")  # a damaged checkpoint
    save_file(tensors, str(weights), metadata={"format": "pt"})
    result = train(model_copy, tiny_dataset_dir, tmp_path, "--batch-size", "4",
                   "--max-steps", "3")
    assert result.returncode == 65, result.stderr[-3000:]
    [line] = error_lines(result)
    assert line.startswith("error: trainer: the loss is nan at step 1, before any optimizer "
                           "update, so not the learning rate: the model's weights or the data"), line
    assert "lower optimizer.lr" not in line
