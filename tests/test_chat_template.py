"""An export answers in the format it was trained on: transformers' own
``apply_chat_template`` on the exported tokenizer renders the training conversations
(system prompts, several turns) to the token ids the trainer fed the model, and their
prompts to a prefix of them; the model card's snippet runs as written; a base model whose
template prompts otherwise fails the export in one line.

Tiny Llama-3 and Qwen2, each trained once on OpenAI-style chat JSONL through
`kubetune local`; transformers runs in the serving venv (tests/test_export_serving.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import user_chat_shapes as shapes
from tests.support.chat_data import CHAT_ARGS, conversations, write_chat_dataset
from tests.support.cli import REPO, clean_env, error_lines, kubetune
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow

TRAIN_ARGS = [*CHAT_ARGS, "epochs=1", "max_steps_per_epoch=1", "batch_size=4",
              "gradient_accumulation_steps=1", "optimizer.lr=3e-3", "seed=0", "dtype=fp32"]
# Where each family's answers end, which generation must stop at.
END_OF_TURN = {"llama3": "<|eot_id|>", "qwen2": "<|im_end|>"}

# Meta-Llama-3-Instruct's template: the format torchtune trains Llama-3 in, but for the
# end-of-text token after the last turn, which a chat template need not render.
LLAMA3_INSTRUCT = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# As Llama-3.1/3.2-Instruct do: a system turn with a date line, always.
LLAMA31_STYLE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + strftime_now("%d %b %Y") + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
# As Qwen2.5-Instruct does: a default system prompt where the conversation has none.
QWEN25_STYLE = """{%- if messages[0]['role'] != 'system' %}
    {{- '<|im_start|>system\\nYou are Qwen, a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# Blocks on lines of their own, indented (trim_blocks, lstrip_blocks), loop controls,
# tojson, a namespace, raise_exception on a path not taken, the named special tokens.
JINJA_FEATURES = """{% set ns = namespace(turns=0) %}
{{ bos_token }}
    {% for message in messages %}
        {% if message['role'] not in ['system', 'user', 'assistant'] %}
            {{ raise_exception('unknown role ' + message['role']) }}
        {% endif %}
        {% if loop.index > 4 %}{% break %}{% endif %}
        {% set ns.turns = ns.turns + 1 %}
[{{ message['role'] }}] {{ message['content'] | tojson }}
    {% endfor %}
turns={{ ns.turns }}{{ eos_token }}
{% if add_generation_prompt %}[assistant] {% endif %}
"""


@dataclass
class ChatRun:
    family: str
    workdir: Path
    command: list[str]

    @property
    def workspace(self) -> Path:
        return self.workdir / "workspace"

    @property
    def export(self) -> Path:  # the default (adapter) export of `kubetune local`
        return self.workspace / "export"

    def env(self) -> dict[str, str]:
        return clean_env(KUBETUNE_WORKSPACE=str(self.workspace))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_chat_dataset(tmp_path_factory.mktemp("chat") / "data")


def _train(family: str, root: Path, data_dir: Path) -> ChatRun:
    from kubetune.tools.demo import write_tiny_model, write_tiny_qwen2

    model = (write_tiny_model if family == "llama3" else write_tiny_qwen2)(root / "model")
    command = ["local", "--workdir", str(root / "run"), "--model", str(model), "--dataset",
               str(data_dir), *TRAIN_ARGS]
    result = kubetune(*command, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return ChatRun(family, root / "run", command)


@pytest.fixture(scope="module")
def llama3_run(tmp_path_factory, data_dir) -> ChatRun:
    return _train("llama3", tmp_path_factory.mktemp("llama3"), data_dir)


@pytest.fixture(scope="module")
def qwen2_run(tmp_path_factory, data_dir) -> ChatRun:
    return _train("qwen2", tmp_path_factory.mktemp("qwen2"), data_dir)


@pytest.fixture(params=["llama3", "qwen2"])
def chat_run(request) -> ChatRun:
    return request.getfixturevalue(f"{request.param}_run")


def trainer_ids(run: ChatRun, rows: list[list[dict[str, str]]]) -> list[list[int]]:
    """The trainer's tokenization: the run's own tokenizer config, through torchtune."""
    from omegaconf import OmegaConf
    from torchtune import config
    from torchtune.data import Message

    cfg = OmegaConf.load(run.workspace / "output" / "kubetune-config.yaml")
    tokenizer = config.instantiate(cfg.tokenizer)
    return [tokenizer.tokenize_messages([Message(m["role"], m["content"],
                                                 masked=m["role"] != "assistant")
                                         for m in messages])[0] for messages in rows]


def transformers_ids(python: Path, tokenizer_dir: Path, rows, tmp: Path,
                     templates: list[str] | None = None) -> dict:
    """tests/support/chat_template_ids.py's answer: ``results`` per template (the
    directory's own without ``templates``), ``eos_token_id``."""
    request = tmp / "request.json"
    request.write_text(json.dumps({"conversations": rows, "chat_templates": templates}))
    result = subprocess.run([str(python), str(REPO / "tests/support/chat_template_ids.py"),
                             str(tokenizer_dir), str(request)], capture_output=True, text=True,
                            timeout=600, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                              "HOME": str(tmp)})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_transformers_renders_training_conversations_to_the_trainers_ids(
        chat_run, serving_python, tmp_path):
    rows = conversations()
    want = trainer_ids(chat_run, rows)
    # The adapter export carries the tokenizer a user loads with it.
    got = transformers_ids(serving_python, chat_run.export, rows, tmp_path)
    for messages, trained, rendered in zip(rows, want, got["results"][0]):
        assert rendered["whole"]["ids"] == trained, (messages, rendered["whole"]["text"])
        prompt = rendered["prompt"]["ids"]
        assert trained[:len(prompt)] == prompt, (messages, rendered["prompt"]["text"])
        assert len(prompt) < len(trained)
    # Generation stops where training ended the answers.
    vocab = json.loads((chat_run.export / "tokenizer.json").read_text())["added_tokens"]
    end_of_turn = next(t["id"] for t in vocab if t["content"] == END_OF_TURN[chat_run.family])
    assert end_of_turn in got["eos_token_id"]


def test_transformers_renders_tool_and_parts_rows_to_the_trainers_ids(
        chat_run, serving_python, tmp_path):
    """OpenAI's tool exchange (tool calls, a tool turn), content parts and a null system
    prompt, as a client passes them, render to the ids the trainer's chat builder fed the
    model for the same rows (issue 43)."""
    from omegaconf import OmegaConf
    from torchtune import config

    from kubetune.trainer.data import chat_messages

    cfg = OmegaConf.load(chat_run.workspace / "output" / "kubetune-config.yaml")
    tokenizer = config.instantiate(cfg.tokenizer)
    rows, want = [], []
    for row in (shapes.tool_exchange(), shapes.content_parts(), shapes.null_system()):
        made = chat_messages.messages(chat_messages.turns(row["messages"], "openai"),
                                      chat_messages.tool_role(tokenizer), False)
        want.append(tokenizer.tokenize_messages(made)[0])
        rows.append(shapes.as_client_sends(row["messages"]))
    got = transformers_ids(serving_python, chat_run.export, rows, tmp_path)
    for messages, trained, rendered in zip(rows, want, got["results"][0]):
        assert rendered["whole"]["ids"] == trained, (messages, rendered["whole"]["text"])
        prompt = rendered["prompt"]["ids"]
        assert trained[:len(prompt)] == prompt, (messages, rendered["prompt"]["text"])


def test_the_renderer_matches_transformers(llama3_run, serving_python, tmp_path):
    """The exporter renders without transformers: its text and ids are transformers'."""
    from kubetune.chat_template import render as rendering

    base = llama3_run.workspace / "model"
    rows = conversations(6, seed=1)
    templates = [LLAMA3_INSTRUCT, LLAMA31_STYLE, QWEN25_STYLE, JINJA_FEATURES]
    got = transformers_ids(serving_python, base, rows, tmp_path, templates)
    encoder, named = rendering.TextTokenizer(base), rendering.named_tokens(base)
    for template, results in zip(templates, got["results"]):
        for messages, rendered in zip(rows, results):
            for name, shown, generation in (("whole", messages, False),
                                            ("prompt", messages[:-1], True)):
                text = rendering.render(template, shown, generation, named)
                assert text == rendered[name]["text"], (template[:40], name)
                assert encoder.encode(text) == rendered[name]["ids"], (template[:40], name)


def _base_with_template(run: ChatRun, template: str, dest: Path) -> Path:
    base = Path(shutil.copytree(run.workspace / "model", dest))
    config = json.loads((base / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    return base


def _export(run: ChatRun, base: Path, dest: Path, *args: str, **env: str):
    return kubetune("export", "--model-dir", str(base), "--export-uri", str(dest),
                    "--no-verify-logits", *args, env={**run.env(), **env})


@pytest.mark.parametrize("family,template,shown", [
    ("llama3", LLAMA31_STYLE, "Cutting Knowledge Date"),
    ("qwen2", QWEN25_STYLE, "You are Qwen"),
])
def test_a_base_template_that_prompts_otherwise_fails_the_export_in_one_line(
        request, family, template, shown, tmp_path):
    run = request.getfixturevalue(f"{family}_run")
    base = _base_with_template(run, template, tmp_path / "base")
    dest = tmp_path / "export"
    term = tmp_path / "termination-log"
    result = _export(run, base, dest, KUBETUNE_TERMINATION_LOG=str(term))
    assert result.returncode == 65, result.stderr[-3000:]
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr[-3000:]
    line = lines[0]
    assert line.startswith("error: exporter: the base model's chat template "
                           "(tokenizer_config.json) does not prompt the model as it was "
                           "trained: "), line
    assert shown in line and "KUBETUNE_EXPORT_CHAT_TEMPLATE=trained" in line, line
    assert term.read_text().strip() == line.removeprefix("error: ")
    assert not dest.exists()

    # What the line says to do: the format the model was trained on replaces the base's.
    replaced = _export(run, base, dest, "--chat-template", "trained")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    exported = json.loads((dest / "tokenizer_config.json").read_text())["chat_template"]
    written = json.loads((run.export / "tokenizer_config.json").read_text())["chat_template"]
    assert exported == written != template


def test_a_base_template_that_prompts_as_trained_is_kept(llama3_run, tmp_path):
    base = _base_with_template(llama3_run, LLAMA3_INSTRUCT, tmp_path / "base")
    # As a Llama-3 base model ships it: generation stops at <|end_of_text|> only.
    (base / "generation_config.json").write_text(json.dumps({"eos_token_id": 257}))
    dest = tmp_path / "export"
    result = _export(llama3_run, base, dest, "--export-format", "both")
    assert result.returncode == 0, result.stderr[-3000:]
    for sub in ("adapter", "merged"):
        tokenizer_config = json.loads((dest / sub / "tokenizer_config.json").read_text())
        assert tokenizer_config["chat_template"] == LLAMA3_INSTRUCT
        eos = json.loads((dest / sub / "generation_config.json").read_text())["eos_token_id"]
        assert eos[0] == 257 and 265 in eos  # <|eot_id|>, which ends every trained answer
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["verification"]["chat_template"].startswith("base's")


def _snippet(card: str) -> str:
    load_it = card.split("## Load it", 1)[1]
    return re.search(r"```python\n(.*?)```", load_it, re.S).group(1)


def test_the_model_cards_snippets_run_as_written(llama3_run, qwen2_run, serving_python,
                                                 tmp_path):
    """The adapter's card (llama3, `kubetune local`'s default export) and a merged model's
    (qwen2): each snippet exactly as the README shows it, in one serving process."""
    merged = tmp_path / "merged"
    result = kubetune("export", "--export-uri", str(merged), "--export-format", "merged",
                      env=qwen2_run.env())
    assert result.returncode == 0, result.stderr[-3000:]
    script = ["import json", "generated = []"]
    for export in (llama3_run.export, merged):
        snippet = _snippet((export / "README.md").read_text())
        assert "apply_chat_template" in snippet and "AutoTokenizer" in snippet, snippet
        # Run as written; then what a reader would check: it generated tokens.
        script += [f"exec({snippet!r}, scope := {{}})",
                   "generated.append(int(scope['output'].shape[1] "
                   "- scope['inputs']['input_ids'].shape[1]))"]
    script.append("print(json.dumps(generated))")
    (tmp_path / "snippets.py").write_text("\n".join(script) + "\n")
    ran = subprocess.run([str(serving_python), str(tmp_path / "snippets.py")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                              "HOME": str(tmp_path)})
    assert ran.returncode == 0, ran.stderr[-3000:]
    generated = json.loads(ran.stdout.strip().splitlines()[-1])
    assert len(generated) == 2 and all(n > 0 for n in generated), generated
