"""Real runs trained in the base model's own chat template, one per family we claim: a
tiny checkpoint of the family (the demo's Llama-3 and Qwen2; the support matrix's
transformers-written Mistral and Gemma; tests/test_model_families.py's transformers-written
Gemma 2, Qwen3, Phi-3 and Phi-4) carrying a tokenizer and chat template shaped like its
instruct model's (tests/support/family_chat_templates.py), trained through `kubetune local`
on chat data with system prompts and several turns (fp32). The run says which format
trained; a template that refuses system turns (Gemma's) drops those rows, counted, and
trains on the others; the merged export carries the template, and transformers'
``apply_chat_template`` on it renders the ids the trainer recorded and prompts with their
prefix; generation stops at the template's end of turn.
tests/test_chat_template_families.py checks the same ids in-process, turn by turn.

Gemma 2, Qwen3, Phi-3 and Phi-4 read the suite's family run (tests/test_sdk_any_model.py
``family_run``: the documented SDK TrainJob, 3 steps, trained once a session and read by
three files); the other four train here, one step each through `kubetune local --model`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.chat_data import write_chat_dataset
from tests.support.cli import clean_env, kubetune
from tests.support.family_chat_templates import FAMILY_TEMPLATES
from tests.test_chat_template import TRAIN_ARGS, transformers_ids
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)
from tests.test_sdk_any_model import FAMILY_RUNS, family_run

# The family runs' TrainJob is built by the kubeflow SDK, whose import warns
# (tests/test_sdk_any_model.py filters it alike).
pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:Support for class-based `config`")]

# family -> the checkpoint it trains on here: the demo's, or the support matrix's model
RUNS = {"qwen2.5": "demo qwen2", "llama3": "demo llama3", "mistral": "Mistral",
        "gemma": "Gemma"}
REFUSES_SYSTEM = ("gemma", "gemma2")  # their templates raise on a system turn


@dataclass(frozen=True)
class Trained:
    family: str
    workspace: Path  # the run's workspace
    merged: Path  # its merged export
    output: str  # kubetune local's stdout and stderr


def _model(family: str, root: Path, serving_python: Path) -> Path:
    from kubetune.tools.demo import write_tiny_model, write_tiny_qwen2

    if RUNS[family].startswith("demo "):
        writer = write_tiny_model if RUNS[family] == "demo llama3" else write_tiny_qwen2
        model = writer(root / "model")
        _, template, named, _ = FAMILY_TEMPLATES[family]
        config_file = model / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config.update(named, chat_template=template)
        config_file.write_text(json.dumps(config))
        return model
    from tests.support.matrix_runner import write_checkpoints
    from tests.test_chat_template_families import write_tokenizer_dir

    (model,) = write_checkpoints(serving_python, root / "checkpoint", [RUNS[family]]).values()
    return write_tokenizer_dir(family, model)  # the same tokenizer, with the template


@pytest.fixture(scope="module", params=sorted({*RUNS, *FAMILY_RUNS}))
def base_run(request, tmp_path_factory, serving_python) -> Trained:  # noqa: F811
    family = request.param
    if family in FAMILY_RUNS:
        shared = family_run(family, serving_python, tmp_path_factory)
        run = Trained(family, shared.workspace, shared.export / "merged", shared.output)
    else:
        run = _train_here(family, tmp_path_factory.mktemp(family.replace(".", "")),
                          serving_python)
    # EXPORT_FORMAT=both: the adapter, checked against the merged weights by the
    # exporter's logits check, and the merged model, in one exporter process (not an
    # adapter export, then a merged one).
    assert "logits: base + adapter matches the merged model" in run.output, run.output[-3000:]
    assert (run.merged / "config.json").is_file()
    assert (run.merged.parent / "adapter" / "adapter_config.json").is_file()
    return run


def _train_here(family: str, root: Path, serving_python: Path) -> Trained:
    data = write_chat_dataset(root / "data")
    model = _model(family, root, serving_python)
    command = ["local", "--workdir", str(root / "run"), "--model", str(model), "--dataset",
               str(data), "--export-uri", str(root / "export"), *TRAIN_ARGS]
    result = kubetune(*command, env=clean_env(EXPORT_FORMAT="both"), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return Trained(family, root / "run" / "workspace", root / "export" / "merged",
                   result.stdout + result.stderr)


def test_the_run_trains_in_the_bases_template_and_says_so(base_run):
    run, output = base_run, base_run.output
    assert "chat template: the base model's own (tokenizer_config.json)" in output, output[-3000:]
    samples = json.loads((run.workspace / "output" / "kubetune-samples.json").read_text())
    assert samples["chat_template"] == FAMILY_TEMPLATES[run.family][1]
    with_system = [s for s in samples["samples"] if s["messages"][0]["role"] == "system"]
    if run.family in REFUSES_SYSTEM:
        # The rows with a system prompt (12 of 16) are dropped by reason; the rest train.
        assert not with_system and samples["samples"], samples["samples"]
        assert re.search(r"^.*\b12\b.*System role not supported.*$", output, re.M), \
            output[-3000:]
    else:
        assert any(len(s["messages"]) >= 4 for s in with_system), samples["samples"]


def test_the_merged_export_renders_the_training_ids(base_run, serving_python, tmp_path):
    run, merged = base_run, base_run.merged
    samples = json.loads((run.workspace / "output" / "kubetune-samples.json").read_text())
    rows = [s["messages"] for s in samples["samples"]]
    got = transformers_ids(serving_python, merged, rows, tmp_path)
    for sample, rendered in zip(samples["samples"], got["results"][0]):
        prompt, trained = rendered["prompt"]["ids"], sample["tokens"]
        assert trained[:len(prompt)] == prompt and len(prompt) < len(trained), \
            rendered["prompt"]["text"]
        if run.family == "mistral":
            # Mistral's template puts the system prompt in the last user turn only: a
            # complete conversation renders without it where the prompt has it, so the
            # answer after the prompt is what training and the template share.
            answer = trained[len(prompt):]
            assert rendered["whole"]["ids"][-len(answer):] == answer, rendered["whole"]["text"]
        else:
            assert rendered["whole"]["ids"] == trained, rendered["whole"]["text"]
    vocab = json.loads((merged / "tokenizer.json").read_text())["added_tokens"]
    end = next(t["id"] for t in vocab if t["content"] == FAMILY_TEMPLATES[run.family][3])
    stops = got["eos_token_id"]
    assert end in (stops if isinstance(stops, list) else [stops])
    if run.family == "qwen2.5":
        assert any("You are Qwen, created by Alibaba Cloud" in r["whole"]["text"]
                   for r in got["results"][0])
