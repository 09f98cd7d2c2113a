"""Real runs trained in the base model's own chat template: a tiny Qwen2 carrying
Qwen2.5-Instruct's template (its default system prompt) and a tiny Llama-3 carrying
Llama-3-Instruct's, each trained through `kubetune local` on chat data with system prompts
and several turns (fp32, one step). The run says which format trained; the merged export
carries the template, and transformers' ``apply_chat_template`` on it renders the ids the
trainer recorded and prompts with their prefix; generation stops at the template's end of
turn. The other families are checked in-process (tests/test_chat_template_families.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.chat_data import write_chat_dataset
from tests.support.cli import kubetune
from tests.support.family_chat_templates import FAMILY_TEMPLATES
from tests.test_chat_template import TRAIN_ARGS, ChatRun, transformers_ids
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow

# family -> the demo model it trains on
RUNS = {"qwen2.5": "qwen2", "llama3": "llama3"}


def _model(family: str, root: Path) -> Path:
    from kubetune.tools.demo import write_tiny_model, write_tiny_qwen2

    model = (write_tiny_model if RUNS[family] == "llama3" else write_tiny_qwen2)(root / "model")
    _, template, named, _ = FAMILY_TEMPLATES[family]
    config_file = model / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(named, chat_template=template)
    config_file.write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module", params=sorted(RUNS))
def base_run(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(family.replace(".", ""))
    data = write_chat_dataset(root / "data")
    model = _model(family, root)
    command = ["local", "--workdir", str(root / "run"), "--model", str(model), "--dataset",
               str(data), *TRAIN_ARGS]
    result = kubetune(*command, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = ChatRun(family, root / "run", command)
    merged = root / "merged"
    exported = kubetune("export", "--model-dir", str(model), "--export-uri", str(merged),
                        "--export-format", "merged", "--no-verify-logits", env=run.env())
    assert exported.returncode == 0, exported.stderr[-3000:]
    return run, model, merged, result.stdout + result.stderr


def test_the_run_trains_in_the_bases_template_and_says_so(base_run):
    run, model, _, output = base_run
    assert "chat template: the base model's own (tokenizer_config.json)" in output, output[-3000:]
    samples = json.loads((run.workspace / "output" / "kubetune-samples.json").read_text())
    assert samples["chat_template"] == FAMILY_TEMPLATES[run.family][1]
    assert any(s["messages"][0]["role"] == "system" and len(s["messages"]) >= 4
               for s in samples["samples"]), samples["samples"]


def test_the_merged_export_renders_the_training_ids(base_run, serving_python, tmp_path):
    run, _, merged, _ = base_run
    samples = json.loads((run.workspace / "output" / "kubetune-samples.json").read_text())
    rows = [s["messages"] for s in samples["samples"]]
    got = transformers_ids(serving_python, merged, rows, tmp_path)
    for sample, rendered in zip(samples["samples"], got["results"][0]):
        assert rendered["whole"]["ids"] == sample["tokens"], rendered["whole"]["text"]
        prompt = rendered["prompt"]["ids"]
        assert sample["tokens"][:len(prompt)] == prompt and len(prompt) < len(sample["tokens"])
    vocab = json.loads((merged / "tokenizer.json").read_text())["added_tokens"]
    end = next(t["id"] for t in vocab if t["content"] == FAMILY_TEMPLATES[run.family][3])
    stops = got["eos_token_id"]
    assert end in (stops if isinstance(stops, list) else [stops])
    if run.family == "qwen2.5":
        assert any("You are Qwen, created by Alibaba Cloud" in r["whole"]["text"]
                   for r in got["results"][0])
