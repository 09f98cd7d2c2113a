"""Chat data as OpenAI and TRL write it, and data torchtune is lenient with (issue 43,
parts 1 and 2): each shape as one row among ordinary ones in JSON Lines, through
`kubetune train`, `tune run` and the checks before launch. Every row trains, or is dropped
and counted by reason with its first row numbers; a whole file of the wrong shape is one
line naming the row (65); never a traceback (70).

The tokenized samples (the labels the loss covers) are checked in this process on the
trainer's own plan; a few real runs on the tiny model prove the whole path."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest

from kubetune.errors import BadInputError
from kubetune.tools.demo import write_tiny_qwen2
from kubetune.trainer.data.chat_messages import RowDropped
from kubetune.trainer.data.dataset_shape import CHAT
from kubetune.workspace import Workspace
from tests.support import user_chat_shapes as shapes
from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.trainer import make_pvc, tune_run

LORA = ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
        "dtype=fp32"]
IGNORED = -100


def _plan(tmp_path: Path, model: Path, dataset: Path, *args: str):
    from kubetune.trainer.planning.plan import plan
    from kubetune.trainer.request.tune_command import parse_tune_run

    pvc = make_pvc(Path(tempfile.mkdtemp(prefix="pvc-", dir=tmp_path)), model, dataset)
    workspace = Workspace.from_env({"KUBETUNE_WORKSPACE": str(pvc.root)})
    return plan(parse_tune_run([*LORA, f"output_dir={pvc.output}",
                                f"checkpointer.checkpoint_dir={pvc.model}", *args]), workspace)


def _built(cfg):
    from torchtune import config

    from kubetune.trainer.recipe_process import dataset_features

    dataset_features.apply()  # as the recipe process does: a config's features dict

    tokenizer = config.instantiate(cfg.tokenizer)
    return tokenizer, config.instantiate(cfg.dataset, tokenizer)


def _trained(tokenizer, sample: dict) -> list[str]:
    """The stretches the loss covers, decoded (special tokens left out)."""
    runs, current = [], []
    for label in sample["labels"]:
        if label != IGNORED:
            current.append(label)
        elif current:
            runs, current = runs + [current], []
    runs += [current] if current else []
    return [tokenizer.decode(run) for run in runs]


def _whole(tokenizer, sample: dict) -> str:
    return tokenizer.decode(sample["tokens"], skip_special_tokens=False)


@pytest.fixture
def mixed(tmp_path) -> Path:
    """40 OpenAI rows: row 2 a null system prompt, 5 a tool exchange, 8 content parts
    (after seven string contents: pyarrow's reader refuses the mix), 3 and 17 assistant
    first."""
    return shapes.write_jsonl(tmp_path / "mixed" / "train.jsonl", shapes.openai_rows(40, {
        2: shapes.null_system(), 5: shapes.tool_exchange(), 8: shapes.content_parts(),
        3: shapes.assistant_first(), 17: shapes.assistant_first()})).parent


def test_openai_grammar_rows_train_on_their_answers(mixed, tiny_model_dir, tmp_path):
    planned = _plan(tmp_path, tiny_model_dir, mixed)
    assert planned.cfg.dataset._component_ == CHAT
    tokenizer, dataset = _built(planned.cfg)
    assert len(dataset) == 40
    # A null system prompt is no system turn.
    null_system = dataset[1]
    assert "<|start_header_id|>system" not in _whole(tokenizer, null_system)
    assert _trained(tokenizer, null_system) == ["It is 4."]
    # The tool exchange: the call (as JSON) and the final answer are trained on; the tool's
    # result is in Llama 3's ipython turn and masked.
    tool = dataset[4]
    whole = _whole(tokenizer, tool)
    assert f"<|start_header_id|>ipython<|end_header_id|>\n\n{shapes.TOOL_RESULT}" in whole
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert _trained(tokenizer, tool) == [call, shapes.TOOL_ANSWER]
    # Content parts are joined.
    assert _trained(tokenizer, dataset[7]) == [shapes.PARTS_ANSWER]
    # A row out of order is dropped with its reason (counted by the token cache).
    with pytest.raises(RowDropped, match="an assistant turn before any user turn"):
        dataset[2]


def test_torchtunes_own_chat_builder_named_reads_the_same(mixed, tiny_model_dir, tmp_path):
    """A config naming torchtune's chat_dataset gets ours: same parameters, and the rows
    torchtune would fail on train."""
    planned = _plan(tmp_path, tiny_model_dir, mixed, "dataset=torchtune.datasets.chat_dataset",
                    "dataset.conversation_column=messages",
                    "dataset.conversation_style=openai", "dataset.split=train")
    assert planned.cfg.dataset._component_ == CHAT
    from torchtune.datasets import chat_dataset

    tokenizer, ours = _built(planned.cfg)
    theirs = chat_dataset(tokenizer, source="json", data_files=str(mixed / "train.jsonl"),
                          conversation_column="messages", conversation_style="openai",
                          split="train")
    for index in (0, 9, 39):  # ordinary rows: the same tokens and labels
        assert ours[index]["tokens"] == theirs[index]["tokens"]
        assert ours[index]["labels"] == theirs[index]["labels"]


def test_qwen2_reads_a_tool_result_as_a_chatml_tool_turn(tmp_path):
    """Qwen2's tokenizer renders any role as ChatML: the tool result is its "tool" turn."""
    model = write_tiny_qwen2(tmp_path / "qwen2")
    data = shapes.write_jsonl(tmp_path / "d" / "train.jsonl",
                              shapes.openai_rows(40, {2: shapes.tool_exchange()})).parent
    planned = _plan(tmp_path, model, data)
    tokenizer, dataset = _built(planned.cfg)
    whole = _whole(tokenizer, dataset[1])
    assert f"<|im_start|>tool\n{shapes.TOOL_RESULT}<|im_end|>" in whole
    assert shapes.TOOL_ANSWER in _trained(tokenizer, dataset[1])[-1]


def test_tool_results_become_user_text_where_the_family_has_no_tool_role():
    from torchtune.data import Message  # noqa: F401 (the messages are torchtune's)

    from kubetune.trainer.data import chat_messages

    turns = chat_messages.turns(shapes.tool_exchange()["messages"], "openai")
    turns.insert(4, chat_messages.Turn("tool", "second"))
    made = chat_messages.messages(turns, None, train_on_input=False)
    assert [m.role for m in made] == ["system", "user", "assistant", "user", "assistant"]
    assert made[3].text_content == (f"<tool_response>\n{shapes.TOOL_RESULT}\n</tool_response>"
                                    "\n<tool_response>\nsecond\n</tool_response>")
    assert made[3].masked and not made[4].masked


@pytest.mark.parametrize("row,reason", [
    ({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"},
                   {"role": "assistant", "content": "c"}]},
     "a tool result without a tool call before it"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                   {"role": "assistant", "content": "c"}]}, "two user turns in a row"),
    ({"messages": [{"role": "user", "content": "a"}]}, "no assistant turn"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "system", "content": "c"}]},
     "a system turn after the conversation began"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
                   {"role": "assistant", "content": "b"}]}, "content part of type 'image_url'"),
    ({"messages": [{"role": "robot", "content": "a"}]}, "a message from 'robot'"),
    ({"messages": []}, "an empty or missing conversation"),
])
def test_a_row_that_cannot_train_says_why(row, reason):
    from kubetune.trainer.data import chat_messages

    with pytest.raises(RowDropped, match=re.escape(reason)):
        chat_messages.messages(chat_messages.turns(row["messages"], "openai"), None, False)


def test_trl_conversational_prompt_completion_trains_on_the_completion(tiny_model_dir,
                                                                       tmp_path):
    data = shapes.write_jsonl(tmp_path / "trl" / "train.jsonl",
                              shapes.trl_conversational(40)).parent
    planned = _plan(tmp_path, tiny_model_dir, data)
    dataset_cfg = planned.cfg.dataset
    assert (dataset_cfg._component_, dataset_cfg.conversation_column,
            dataset_cfg.completion_column) == (CHAT, "prompt", "completion")
    [line] = [n for n in planned.notes if "prompt-completion" in n]
    assert "trains on the completion only" in line
    tokenizer, dataset = _built(planned.cfg)
    sample = dataset[3]
    assert "What is 3 plus 3?" in _whole(tokenizer, sample)
    assert _trained(tokenizer, sample) == ["It is 6."]


def test_trl_standard_prompt_completion_trains_on_the_completion(tiny_model_dir, tmp_path):
    data = shapes.write_jsonl(tmp_path / "std" / "train.jsonl", shapes.trl_standard(40)).parent
    planned = _plan(tmp_path, tiny_model_dir, data)
    assert planned.cfg.dataset._component_ == "torchtune.datasets.instruct_dataset"
    tokenizer, dataset = _built(planned.cfg)
    assert [t.strip() for t in _trained(tokenizer, dataset[3])] == ["It is 6."]


def test_alpaca_null_input_trains_as_absent(tiny_model_dir, tmp_path):
    data = shapes.write_jsonl(tmp_path / "alp" / "train.jsonl",
                              shapes.alpaca_null_input(40)).parent
    planned = _plan(tmp_path, tiny_model_dir, data)
    tokenizer, dataset = _built(planned.cfg)
    assert "### Input" not in _whole(tokenizer, dataset[1])  # input null: no input section
    assert "### Input" in _whole(tokenizer, dataset[0])


def test_a_csv_of_number_answers_reads_as_text(tiny_model_dir, tmp_path):
    data = shapes.write_numbers_csv(tmp_path / "csv" / "train.csv", 40).parent
    planned = _plan(tmp_path, tiny_model_dir, data)
    tokenizer, dataset = _built(planned.cfg)
    sample = dataset[3]
    assert _trained(tokenizer, sample)[-1].endswith("Response:\n6") or \
        _trained(tokenizer, sample)[-1].endswith("6")
    assert "### Input" not in _whole(tokenizer, sample)  # an empty cell: no input


def test_a_file_of_no_conversations_is_refused_naming_the_row(tiny_model_dir, tmp_path):
    rows = [{"messages": f"hello {i}"} for i in range(40)]
    data = shapes.write_jsonl(tmp_path / "bad" / "train.jsonl", rows).parent
    with pytest.raises(BadInputError, match=r"sampled row 1: 'hello 0' is not a list"):
        _plan(tmp_path, tiny_model_dir, data, "dataset=torchtune.datasets.chat_dataset",
              "dataset.conversation_column=messages", "dataset.conversation_style=openai",
              "dataset.split=train")


def _train(model: Path, dataset: Path, root: Path, *args: str):
    return kubetune("train", "--model-dir", str(model), "--dataset-dir", str(dataset),
                    "--output-dir", str(root / "output"), "--epochs", "1",
                    "--batch-size", "4", "--gradient-accumulation-steps", "1", "dtype=fp32",
                    "tokenizer.max_seq_len=256", "dataset.packed=False", *args,
                    env=clean_env(KUBETUNE_TERMINATION_LOG=str(root / "termination-log"),
                                  KUBETUNE_TOKEN_CACHE_DIR=str(root / "cache")))


@pytest.mark.slow
def test_kubetune_train_trains_the_mixed_file_and_counts_the_dropped(mixed, tiny_model_dir,
                                                                     tmp_path):
    # Row 40 longer than the context: its answer is cut away, so it is dropped too.
    rows = [json.loads(line) for line in (mixed / "train.jsonl").read_text().splitlines()]
    rows[39] = {"messages": [{"role": "user", "content": "word " * 400},
                             {"role": "assistant", "content": "ok"}]}
    shapes.write_jsonl(mixed / "train.jsonl", rows)
    result = _train(tiny_model_dir, mixed, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if "train: dropped" in line]
    assert "dropped 3 of 40 rows: 2 with an assistant turn before any user turn (rows 3, 17)" \
        in line, line
    assert "1 with no token to train on after truncation to tokenizer.max_seq_len=256" in line
    assert "row 40)" in line
    summary = json.loads((tmp_path / "output" / "summary.json").read_text())
    assert summary["steps"] == 37 // 4 + (37 % 4 > 0) or summary["steps"] >= 9
    samples = json.loads((tmp_path / "output" / "kubetune-samples.json").read_text())
    assert samples["samples"]


@pytest.mark.slow
def test_a_file_whose_every_row_is_out_of_order_is_one_line(tiny_model_dir, tmp_path):
    data = shapes.write_jsonl(tmp_path / "d" / "train.jsonl",
                              [shapes.assistant_first()] * 12).parent
    result = _train(tiny_model_dir, data, tmp_path)
    assert result.returncode == 65, result.stderr[-3000:]
    [line] = error_lines(result)
    assert "none of the 12 rows trains: with an assistant turn before any user turn " \
           "(rows 1, 2, 3, 4, 5, ...)" in line, line
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_tune_run_trains_trl_conversational_rows(tiny_model_dir, tmp_path):
    data = shapes.write_jsonl(tmp_path / "trl" / "train.jsonl",
                              shapes.trl_conversational(40)).parent
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, data)
    result = tune_run(pvc, *LORA, *pvc.runtime_args(), "batch_size=4", "epochs=1",
                      "max_steps_per_epoch=2", "gradient_accumulation_steps=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "chat prompt-completion (TRL" in result.stderr + result.stdout
    assert pvc.complete()


@pytest.mark.parametrize("family", ["llama3", "qwen2"])
def test_the_exported_template_renders_tool_and_parts_rows_as_trained(family, tiny_model_dir,
                                                                      tmp_path):
    """The trainer's recorded samples of these rows (``sample_capture``) pass the
    exporter's check: torchtune's format as a chat template renders each one, tool turns
    included, to the ids training fed the model."""
    from kubetune.exporter import chat_format
    from kubetune.tools.demo import write_tiny_qwen2
    from kubetune.trainer.recipe_process import sample_capture

    model = tiny_model_dir if family == "llama3" else write_tiny_qwen2(tmp_path / "qwen2")
    data = shapes.write_jsonl(tmp_path / "d" / "train.jsonl", shapes.openai_rows(40, {
        1: shapes.tool_exchange(), 2: shapes.content_parts(), 3: shapes.null_system()})).parent
    planned = _plan(tmp_path, model, data)
    tokenizer, dataset = _built(planned.cfg)
    recorder = sample_capture.Recorder(tokenizer)
    for index in range(4):
        dataset[index]
    recorder.remove()
    samples = sample_capture._describe(tokenizer, "run", recorder.samples)
    assert [m["role"] for m in samples.samples[0].messages] == [
        "system", "user", "assistant", "tool", "assistant"]
    decided = chat_format.decide(samples, model, "trained")
    assert decided.template is not None
    assert "reproduces 4 training sample(s) exactly" in decided.report["chat_template"]


def test_qwen2_5s_template_renders_tool_results_as_its_tokenizer_does(tmp_path):
    """Qwen2.5's tokenizer (Qwen2.5, Qwen3) puts tool results in a user turn as
    <tool_response> blocks: the exported template renders them the same, consecutive
    results in one turn."""
    from torchtune.models.qwen2_5._tokenizer import Qwen2_5Tokenizer

    from kubetune.exporter import chat_format
    from kubetune.tools.demo import write_tiny_qwen2
    from kubetune.tools.demo.tiny_qwen2 import special_token_ids
    from kubetune.trainer.data import chat_messages
    from kubetune.trainer.recipe_process import sample_capture

    model = write_tiny_qwen2(tmp_path / "qwen2")
    ids = special_token_ids()
    spare = max(ids.values()) + 1  # tool-call tokens: unused by text-rendered calls
    tokenizer = Qwen2_5Tokenizer(str(model / "vocab.json"), str(model / "merges.txt"),
                                 {**ids, "<tool_call>": spare, "</tool_call>": spare + 1},
                                 eos_token="<|im_end|>")
    assert chat_messages.tool_role(tokenizer) == "ipython"
    exchange = shapes.tool_exchange()["messages"]
    two_results = [*exchange[:4], {"role": "tool", "content": "second"}, exchange[4]]
    recorder = sample_capture.Recorder(tokenizer)
    for conversation in (exchange, two_results, shapes.content_parts()["messages"]):
        made = chat_messages.messages(chat_messages.turns(conversation, "openai"), "ipython",
                                      False)
        tokens, _ = tokenizer.tokenize_messages(made)
        assert "<tool_response>" in tokenizer.decode(tokens) or conversation[0]["role"] == "user"
    recorder.remove()
    samples = sample_capture._describe(tokenizer, "run", recorder.samples)
    decided = chat_format.decide(samples, model, "trained")
    assert "reproduces 3 training sample(s) exactly" in decided.report["chat_template"]


def test_the_dataset_initializer_reads_contents_of_mixed_types(mixed):
    """pyarrow's JSON reader refuses a column that is a string in one row and a list in
    another ("changed from string to array in row 7"); the rows are valid OpenAI."""
    from kubetune.initializers.verify_dataset import describe

    assert describe(mixed) == {"format": "json", "files": ["train.jsonl"], "rows": 40,
                               "columns": ["messages"]}


@pytest.mark.slow
def test_kubetune_local_trains_the_mixed_file(mixed, tmp_path):
    work = tmp_path / "work"
    result = kubetune("local", "--workdir", str(work), "--dataset", str(mixed),
                      "batch_size=4", "gradient_accumulation_steps=1", "max_steps_per_epoch=2",
                      "epochs=1", "dtype=fp32", env=clean_env(), timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    said = [line for line in (result.stdout + result.stderr).splitlines()
            if "train: dropped" in line]
    assert len(said) == 1 and "with an assistant turn before any user turn (rows 3, 17)" \
        in said[0], said
    assert (work / "workspace" / "export" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("family", ["llama3", "qwen2"])
def test_the_exported_template_takes_openais_messages_as_trained(family, tiny_model_dir,
                                                                 tmp_path):
    """At inference a client passes OpenAI's messages themselves (tool calls with their
    arguments as a dict, as transformers takes them; content parts; a null system
    prompt): the exported template renders them to the ids training fed the model."""
    from kubetune.chat_template import render as rendering
    from kubetune.chat_template.torchtune_formats import trained_template
    from kubetune.tools.demo import write_tiny_qwen2
    from kubetune.trainer.data import chat_messages
    from kubetune.trainer.recipe_process import sample_capture

    model = tiny_model_dir if family == "llama3" else write_tiny_qwen2(tmp_path / "qwen2")
    data = shapes.write_jsonl(tmp_path / "d" / "train.jsonl", shapes.openai_rows(40)).parent
    tokenizer, _ = _built(_plan(tmp_path, model, data).cfg)
    described = sample_capture._describe(tokenizer, "run", [])
    template = trained_template(described.tokenizer, None, described.bos_token,
                                described.eos_token)
    encoder, named = rendering.TextTokenizer(model), rendering.named_tokens(model)
    for row in (shapes.tool_exchange(), shapes.content_parts(), shapes.null_system()):
        conversation = row["messages"]
        made = chat_messages.messages(chat_messages.turns(conversation, "openai"),
                                      chat_messages.tool_role(tokenizer), False)
        trained, _ = tokenizer.tokenize_messages(made)
        client = shapes.as_client_sends(conversation)
        whole = encoder.encode(rendering.render(template, client, False, named))
        assert whole == trained, (family, row)
        prompt = encoder.encode(rendering.render(template, client[:-1], True, named))
        assert trained[:len(prompt)] == prompt


def test_sharegpt_tool_speakers_and_openais_developer_role_are_read():
    from kubetune.trainer.data import chat_messages

    sharegpt = [{"from": "human", "value": "Weather?"},
                {"from": "function_call", "value": '{"name": "get_weather"}'},
                {"from": "observation", "value": "21 C"}, {"from": "gpt", "value": "Warm."}]
    made = chat_messages.messages(chat_messages.turns(sharegpt, "sharegpt"), "ipython", False)
    assert [(m.role, m.masked) for m in made] == [("user", True), ("assistant", False),
                                                  ("ipython", True), ("assistant", False)]
    openai = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello.", "weight": 0},
              {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hi."}]
    made = chat_messages.messages(chat_messages.turns(openai, "openai"), None, False)
    assert [(m.role, m.masked) for m in made] == [
        ("system", True), ("user", True), ("assistant", True), ("user", True),
        ("assistant", False)]  # weight 0: that answer is not trained on


def test_the_drop_line_counts_each_reason_with_its_first_rows():
    from kubetune.trainer.data.token_cache.dropped import (NO_TOKEN, Drops, dropped_line,
                                                           reason_of)

    drops, other = Drops(), Drops()
    for index in (2, 16):
        drops.add("an assistant turn before any user turn", index)
    for index in range(20, 30):
        other.add(NO_TOKEN, index)
    drops.merge(other)
    line = dropped_line(12, 40, 256, drops.meta())
    assert line.startswith("train: dropped 12 of 40 rows: 10 with no token to train on after "
                           "truncation to tokenizer.max_seq_len=256 (a prompt that fills it "
                           "leaves no answer; rows 21, 22, 23, 24, 25, ...); 2 with an "
                           "assistant turn before any user turn (rows 3, 17): raise "), line
    single = Drops()
    single.add("no assistant turn", 4)
    assert dropped_line(1, 40, 256, single.meta()) == \
        "train: dropped 1 of 40 rows with no assistant turn (row 5)"
    # torchtune's own per-row errors, in the line's words; a file error is not the row's.
    assert reason_of(ValueError("Two consecutive user messages at index 2 and 1 in "
                                "messages")) == "two user turns in a row"
    assert reason_of(OSError("disk")) is None


class _Rows:
    """Rows of tokens and labels; every 500th cannot train (its transform says why)."""

    def __len__(self) -> int:
        return 3000

    def __getitem__(self, index: int) -> dict:
        if index % 500 == 7:
            raise RowDropped("a tool result without a tool call before it")
        return {"tokens": [1, 2, 3], "labels": [-100, 2, 3]}


def test_rows_dropped_in_forked_workers_are_counted_in_order():
    import numpy as np

    from kubetune.trainer.data.token_cache import build

    written = []
    counts = build.tokenize(_Rows(), None, IGNORED, workers=2,
                            write=lambda tokens, labels: written.append(len(tokens)))
    assert counts.read == 3000 and counts.kept == 3000 - 6
    assert counts.drops.meta() == {"a tool result without a tool call before it": {
        "count": 6, "rows": [8, 508, 1008, 1508, 2008]}}
    assert int(np.sum(written)) == 3 * counts.kept
