"""A dataset builder of one's own receives only what its signature takes (issue 47).

Settings made for torchtune's builders (``KUBETUNE_SYSTEM_PROMPT``, ``KUBETUNE_COLUMN_MAP``,
``KUBETUNE_PACKING``...) are refused before any step, in one line naming the setting as the
user wrote it and the builder, where the builder cannot take them; a builder that takes
one gets it. docs/extending.md lists what a builder receives, and says so as the code does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kubetune.trainer.config.builder_settings import SECTIONS, takes
from kubetune.trainer.config.component_params import ComponentParams
from kubetune.trainer.request.train_options import OPTION_KEYS
from tests.support.cli import error_lines
from tests.support.trainer import make_pvc, tune_run

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "custom-dataset"
BUILDER = "my_datasets.arithmetic_chat_dataset"
DOC = REPO / "docs" / "extending.md"

# A builder that takes new_system_prompt and says what it got, in the trainer's log.
PROMPTED = '''
from torchtune.datasets import SFTDataset
from my_datasets import ArithmeticToChat


def prompted_dataset(tokenizer, source="parquet", data_files=None, split="train",
                     new_system_prompt=None, **load_dataset_kwargs):
    print(f"prompted_dataset: new_system_prompt={new_system_prompt!r}")
    return SFTDataset(source=source, data_files=data_files, split=split,
                      message_transform=ArithmeticToChat(), model_transform=tokenizer,
                      **load_dataset_kwargs)
'''


def _run(tmp_path, tiny_model_dir, tiny_dataset_dir, builder: str, *args: str,
         extra_path: Path | None = None, **env: str):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    path = f"{extra_path}:{EXAMPLE}:{REPO}" if extra_path else f"{EXAMPLE}:{REPO}"
    result = tune_run(pvc, "lora_finetune_single_device", "--config",
                      "llama3_2/1B_lora_single_device", f"dataset._component_={builder}",
                      *pvc.runtime_args(), "epochs=1", "max_steps_per_epoch=2",
                      "batch_size=8", "seed=0", "dtype=fp32", *args,
                      env=pvc.env(PYTHONPATH=path, **env))
    return pvc, result


@pytest.mark.parametrize("setting,value,key", [
    ("KUBETUNE_SYSTEM_PROMPT", "Answer briefly.", "new_system_prompt"),
    ("KUBETUNE_COLUMN_MAP", "input=question", "column_map"),
    ("KUBETUNE_PACKING", "true", "packed"),
    ("KUBETUNE_TRAIN_ON_INPUT", "true", "train_on_input"),
])
def test_a_setting_the_builder_cannot_take_is_one_line_65(tmp_path, tiny_model_dir,
                                                          tiny_dataset_dir, setting, value,
                                                          key):
    pvc, result = _run(tmp_path, tiny_model_dir, tiny_dataset_dir, BUILDER,
                       "--kubetune-dry-run", **{setting: value})
    assert result.returncode == 65, result.stderr[-3000:]
    assert error_lines(result) == [
        f"error: trainer: {setting}: {BUILDER} takes no {key}; unset it, or accept {key} in the "
        "builder"], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (pvc.output / "metrics.jsonl").exists()


def test_an_override_is_named_as_written(tmp_path, tiny_model_dir, tiny_dataset_dir):
    _, result = _run(tmp_path, tiny_model_dir, tiny_dataset_dir, BUILDER,
                     "dataset.new_system_prompt=Hi", "--kubetune-dry-run")
    assert result.returncode == 65, result.stderr[-3000:]
    assert error_lines(result) == [
        f"error: trainer: dataset.new_system_prompt: {BUILDER} takes no new_system_prompt; remove "
        "dataset.new_system_prompt, or accept new_system_prompt in the builder"]


def test_the_configs_packed_default_is_left_out(tmp_path, tiny_model_dir, tiny_dataset_dir):
    """The shipped config's ``packed: False`` is not the user's: a builder without the
    parameter gets none, and the run plans (packing off said explicitly asks for nothing)."""
    _, result = _run(tmp_path, tiny_model_dir, tiny_dataset_dir, BUILDER,
                     "--kubetune-dry-run", KUBETUNE_PACKING="false")
    assert result.returncode == 0, result.stderr[-3000:]
    planned = yaml.safe_load(result.stdout.split("config:\n", 1)[1].split("\ncommand:", 1)[0])
    assert "packed" not in planned["dataset"]
    assert planned["dataset"]["_component_"] == BUILDER


@pytest.mark.slow
def test_a_builder_that_takes_the_prompt_gets_it_and_trains(tmp_path, tiny_model_dir,
                                                            tiny_dataset_dir):
    own = tmp_path / "own"
    own.mkdir()
    (own / "prompted.py").write_text(PROMPTED)
    pvc, result = _run(tmp_path, tiny_model_dir, tiny_dataset_dir,
                       "prompted.prompted_dataset", extra_path=own,
                       KUBETUNE_SYSTEM_PROMPT="Answer briefly.")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "prompted_dataset: new_system_prompt='Answer briefly.'" in \
        result.stdout + result.stderr
    assert pvc.summary()["steps"] == 2


def test_takes_by_name_or_as_load_dataset_key():
    open_ended = ComponentParams({"tokenizer": None, "source": "parquet"}, var_kwargs=True)
    assert takes(open_ended, "source") and takes(open_ended, "split")
    assert not takes(open_ended, "new_system_prompt") and not takes(open_ended, "column_map")
    closed = ComponentParams({"tokenizer": None, "packed": False}, var_kwargs=False)
    assert takes(closed, "packed") and not takes(closed, "split")


def _doc_section() -> str:
    text = DOC.read_text()
    return text.split("## What a dataset builder receives", 1)[1].split("\n#", 1)[0]


def test_the_doc_lists_every_dataset_setting_a_builder_may_receive():
    """Every option (and its variable) that sets a ``dataset.*`` key is in the doc's list,
    under that key, and the doc names the rule the code applies."""
    section = _doc_section()
    dataset_keys = {key.split(".", 1)[1] for key in OPTION_KEYS.values()
                    if key.split(".", 1)[0] in SECTIONS}
    listed = {name for line in section.splitlines() if line.startswith("- ")
              for name in re.findall(r"`(\w+)`", line.split(":", 1)[0])}
    assert dataset_keys <= listed, dataset_keys - listed
    assert {"source", "data_files", "tokenizer"} <= listed
    assert "**kwargs" in section and "65" in section
