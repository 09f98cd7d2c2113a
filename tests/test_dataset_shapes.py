"""Users' own data, in every common shape, on the paths that name no dataset builder
(`kubetune local --dataset`, `kubetune train` and the byo-model runtime, `tune run` with a
shipped config): the trainer recognises the shape from the columns, says so in one line
and trains as torchtune trains it; bad data is located before launch, in the user's terms.

Most of it is checked on the plan (in this process) and on the tokenized samples the
recipe would train on; one real run per chat style proves the whole path."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml

from kubetune.errors import BadInputError
from kubetune.tools.demo import write_tiny_alpaca_dataset, write_tiny_dataset
from kubetune.workspace import Workspace
from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.sdk_trainjob import sdk_container_trainjob_spec, sdk_trainjob_spec
from tests.support.runtimes import runtime_file
from tests.support.trainer import make_pvc, tune_run
from tests.support.user_data import (SYSTEM_PROMPT, chat_rows, conversations,
                                     write_broken_jsonl, write_chat, write_hub_like,
                                     write_text)
from tests.test_trainer_config_checks import _dry_run_trainer

LORA = ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
        "dtype=fp32"]
CHAT = "kubetune.trainer.data.chat_dataset.chat_dataset"  # also for torchtune's, named
IGNORED = -100  # torchtune's CROSS_ENTROPY_IGNORE_INDEX: a label the loss skips


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("user-data")
    return {"openai": write_chat(root / "chat-openai", "openai"),
            "sharegpt": write_chat(root / "chat-sharegpt", "sharegpt"),
            "text": write_text(root / "notes"),
            "alpaca": write_tiny_alpaca_dataset(root / "alpaca", rows=64),
            "instruct": write_tiny_dataset(root / "instruct", rows=64),
            "qa": write_tiny_dataset(root / "qa", rows=64, columns=("question", "answer"))}


def _plan(tmp_path: Path, model: Path, dataset: Path, *args: str):
    """The trainer's plan of `tune run` on a stand-in PVC holding ``dataset``."""
    from kubetune.trainer.planning.plan import plan
    from kubetune.trainer.request.tune_command import parse_tune_run

    pvc = make_pvc(Path(tempfile.mkdtemp(prefix="pvc-", dir=tmp_path)), model, dataset)
    workspace = Workspace.from_env({"KUBETUNE_WORKSPACE": str(pvc.root)})
    return plan(parse_tune_run([*LORA, f"output_dir={pvc.output}",
                                f"checkpointer.checkpoint_dir={pvc.model}", *args]), workspace)


def _tokenized(cfg):
    """The planned dataset as the recipe builds it: (tokenizer, dataset)."""
    from torchtune import config

    tokenizer = config.instantiate(cfg.tokenizer)
    return tokenizer, config.instantiate(cfg.dataset, tokenizer)


def _trained_runs(sample: dict) -> list[list[int]]:
    """The stretches of tokens the loss covers (labels not ignored), in order."""
    runs, current = [], []
    for label in sample["labels"]:
        if label != IGNORED:
            current.append(label)
        elif current:
            runs, current = runs + [current], []
    return runs + ([current] if current else [])


def _shape_lines(notes: list[str]) -> list[str]:
    return [n for n in notes if n.startswith("dataset: ") and " data (columns " in n]


@pytest.mark.parametrize("style", ["openai", "sharegpt"])
def test_chat_trains_on_the_assistant_turns_only(style, sources, tiny_model_dir, tmp_path):
    planned = _plan(tmp_path, tiny_model_dir, sources[style])
    dataset = planned.cfg.dataset
    column = "messages" if style == "openai" else "conversations"
    assert dataset._component_ == CHAT
    assert (dataset.conversation_column, dataset.conversation_style) == (column, style)
    assert "column_map" not in dataset
    lines = _shape_lines(planned.notes)
    assert len(lines) == 1 and CHAT in lines[0] and f"columns {column}" in lines[0]
    assert "turns only" in lines[0]

    tokenizer, samples = _tokenized(planned.cfg)
    first = conversations(1)[0]
    runs = [tokenizer.decode(run) for run in _trained_runs(samples[0])]
    assert runs == [text for speaker, text in first if speaker == "assistant"]
    # The system prompt and the user turns are in the input, never in the loss.
    whole = tokenizer.decode(samples[0]["tokens"])
    assert SYSTEM_PROMPT in whole and first[1][1] in whole
    assert not any(SYSTEM_PROMPT in run or "What is" in run for run in runs)

    # A builder the user names is theirs: no detection replaces it.
    with pytest.raises(BadInputError, match=r"has columns \['.*'\] but instruct_dataset"):
        _plan(tmp_path, tiny_model_dir, sources[style], "dataset=torchtune.datasets.instruct_dataset")


@pytest.mark.parametrize("shape,builder,says", [
    ("text", "torchtune.datasets.text_completion_dataset", "plain text data (columns text)"),
    ("alpaca", "torchtune.datasets.alpaca_cleaned_dataset",
     "alpaca data (columns instruction, input, output)"),
    ("instruct", "torchtune.datasets.instruct_dataset", "instruct data (columns input, output)"),
    ("qa", "torchtune.datasets.instruct_dataset", "instruct data (columns question, answer)"),
])
def test_each_shape_gets_its_builder_and_one_line(shape, builder, says, sources,
                                                  tiny_model_dir, tmp_path):
    planned = _plan(tmp_path, tiny_model_dir, sources[shape])
    assert planned.cfg.dataset._component_ == builder
    lines = _shape_lines(planned.notes)
    assert len(lines) == 1 and says in lines[0] and builder in lines[0]
    if shape == "text":
        tokenizer, samples = _tokenized(planned.cfg)
        sample = samples[0]
        assert sample["labels"] == sample["tokens"]  # every token is trained on
        assert "The sum of" in tokenizer.decode(sample["tokens"])


def _doc_examples() -> list[str]:
    """The JSON Lines examples of docs/trainer.md's "Your data's shape", in order."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "trainer.md").read_text()
    section = text.split("## Your data's shape", 1)[1].split("\n## ", 1)[0]
    return [block.split("\n```", 1)[0] for block in section.split("```json\n")[1:]]


def test_the_documented_examples_get_the_documented_builders(tiny_model_dir, tmp_path):
    expected = [(CHAT, "openai"), (CHAT, "openai"), (CHAT, "sharegpt"), (CHAT, "openai"),
                ("torchtune.datasets.alpaca_cleaned_dataset", None),
                ("torchtune.datasets.instruct_dataset", None),
                ("torchtune.datasets.text_completion_dataset", None)]
    examples = _doc_examples()
    assert len(examples) == len(expected)
    for number, (example, (builder, style)) in enumerate(zip(examples, expected)):
        data = tmp_path / f"example-{number}"
        data.mkdir()
        # Three rows make no optimizer step: the same rows, repeated.
        (data / "train.jsonl").write_text((example.strip() + "\n") * 4)
        dataset = _plan(tmp_path, tiny_model_dir, data, "batch_size=1",
                        "gradient_accumulation_steps=1").cfg.dataset
        assert dataset._component_ == builder
        assert dataset.get("conversation_style") == style


def test_a_column_map_names_the_chat_column(sources, tiny_model_dir, tmp_path):
    renamed = tmp_path / "dialogs"
    rows = [{"dialog": row["messages"]} for row in chat_rows("openai", 40)]
    (renamed / "train.jsonl").parent.mkdir()
    (renamed / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    planned = _plan(tmp_path, tiny_model_dir, renamed, "dataset.column_map={messages: dialog}")
    dataset = planned.cfg.dataset
    assert (dataset._component_, dataset.conversation_column) == (CHAT, "dialog")
    assert dataset.conversation_style == "openai" and "column_map" not in dataset


@pytest.mark.parametrize("runtime", ["kubetune-byo-model", "torchtune-llama3.2-1b"])
def test_runtimes_that_name_no_builder_read_chat_as_chat(runtime, sources, tiny_model_dir,
                                                         tmp_path):
    """The byo-model runtime (`kubetune train`) and a drop-in with the SDK's default
    dataset form (no dataset_preprocess_config: `tune run` with the config's builder)."""
    if runtime.startswith("torchtune-"):
        spec = sdk_trainjob_spec(runtime_file(runtime), dataset_preprocess_config=None,
                                 batch_size=2)
    else:
        spec = sdk_container_trainjob_spec(runtime_file(runtime), "hf://org/model",
                                           "hf://org/chat", {"KUBETUNE_METHOD": "lora"},
                                           {"gpu": 1})
    result = _dry_run_trainer(f"{runtime}.yaml", spec, tiny_model_dir, sources["sharegpt"],
                              tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    cfg = yaml.safe_load(result.stdout.split("\nconfig:\n", 1)[1].split("\ncommand:", 1)[0])
    assert cfg["dataset"]["_component_"] == CHAT
    assert cfg["dataset"]["conversation_style"] == "sharegpt"


def test_a_column_map_typo_is_named_in_the_runtimes_syntax(sources, tiny_model_dir, tmp_path):
    env = {"KUBETUNE_METHOD": "lora", "KUBETUNE_COLUMN_MAP": "input=questoin,output=answer"}
    spec = sdk_container_trainjob_spec(runtime_file("kubetune-byo-model"), "hf://org/model",
                                       "hf://org/qa", env, {"gpu": 1})
    result = _dry_run_trainer("kubetune-byo-model.yaml", spec, tiny_model_dir, sources["qa"],
                              tmp_path)
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    assert "no column 'questoin' (KUBETUNE_COLUMN_MAP maps input to it; did you mean " \
           "'question'?)" in line
    assert line.endswith("set KUBETUNE_COLUMN_MAP=input=question,output=answer")


def test_a_column_map_typo_from_a_drop_in_trainjobs_env_names_the_variable(
        sources, tiny_model_dir, tmp_path):
    # A drop-in runs `tune run`; its TrainJob's env still sets KUBETUNE_COLUMN_MAP, so the
    # hint names that variable, not a dataset.column_map the user never wrote.
    spec = sdk_trainjob_spec(runtime_file("torchtune-llama3.2-1b"),
                             dataset_preprocess_config=None, batch_size=2)
    spec["trainer"]["env"] = [{"name": "KUBETUNE_COLUMN_MAP",
                               "value": "input=questoin,output=answer"}]
    result = _dry_run_trainer("torchtune-llama3.2-1b.yaml", spec, tiny_model_dir,
                              sources["qa"], tmp_path)
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    assert "KUBETUNE_COLUMN_MAP maps input to it; did you mean 'question'?" in line
    assert line.endswith("set KUBETUNE_COLUMN_MAP=input=question,output=answer")


def test_a_column_map_typo_is_named_in_tune_runs_syntax(sources, tiny_model_dir, tmp_path):
    with pytest.raises(BadInputError) as raised:
        _plan(tmp_path, tiny_model_dir, sources["qa"],
              "dataset.column_map={input: questoin, output: answer}")
    message = str(raised.value)
    assert "no column 'questoin' (dataset.column_map maps input to it; did you mean " \
           "'question'?)" in message
    assert message.endswith("set dataset.column_map={'input': 'question', 'output': 'answer'}")


def _local_refuses(tmp_path: Path, model: Path, dataset: Path) -> str:
    """`kubetune local --dataset`'s one error line: the dataset initializer's check, which
    it runs before any step."""
    result = kubetune("local", "--workdir", str(tmp_path / "work"), "--model", str(model),
                      "--dataset", str(dataset), env=clean_env())
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    assert not (tmp_path / "work" / "workspace" / "dataset").exists()
    return line


def test_a_broken_line_is_named_by_file_and_line(tiny_model_dir, tmp_path):
    broken = write_broken_jsonl(tmp_path / "broken", rows=40, broken_line=18)
    # The trainer's check (a workspace no initializer wrote, `tune run` on it) ...
    with pytest.raises(BadInputError, match=r"train\.jsonl line 18 is not valid JSON"):
        _plan(tmp_path, tiny_model_dir, broken)
    # ... and the dataset initializer's.
    line = _local_refuses(tmp_path, tiny_model_dir, broken)
    assert "data file train.jsonl line 18 is not valid JSON (Unterminated string" in line
    assert "fix or remove that line" in line


def test_an_empty_file_is_called_empty(tiny_model_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "train.jsonl").write_text("")
    with pytest.raises(BadInputError, match=r"dataset file .*train\.jsonl is empty"):
        _plan(tmp_path, tiny_model_dir, empty)
    assert "data file train.jsonl is empty" in _local_refuses(tmp_path, tiny_model_dir, empty)


def test_a_data_dir_without_a_data_file_is_one_line_before_launch(tiny_model_dir, tmp_path):
    only_readme = tmp_path / "only-readme"
    only_readme.mkdir()
    (only_readme / "README.txt").write_text("hello\n")
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, None)
    result = tune_run(pvc, *LORA, *pvc.runtime_args(), "dataset.source=parquet",
                      f"dataset.data_dir={only_readme}")
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    assert f"dataset.data_dir {only_readme} holds no parquet data file (only README.txt)" in line
    assert "Traceback" not in result.stderr and not pvc.complete()


def test_a_hub_datasets_readme_and_license_are_never_read_as_data(tiny_model_dir, tmp_path):
    hub = write_hub_like(tmp_path / "sums", rows=64)
    planned = _plan(tmp_path, tiny_model_dir, hub, "dataset.source=parquet",
                    f"dataset.data_dir={hub}")
    _, samples = _tokenized(planned.cfg)
    assert len(samples) == 64  # the parquet's rows, and nothing read from LICENSE or README


@pytest.mark.slow
@pytest.mark.parametrize("style", ["openai", "sharegpt"])
def test_kubetune_local_trains_on_chat_data(style, sources, tmp_path):
    work = tmp_path / "work"
    result = kubetune("local", "--workdir", str(work), "--dataset", str(sources[style]),
                      "batch_size=2", "gradient_accumulation_steps=1", "max_steps_per_epoch=2",
                      "epochs=1", "dtype=fp32", env=clean_env())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = [line for line in (result.stdout + result.stderr).splitlines()
             if "INFO dataset: chat" in line]
    assert len(lines) == 1 and f"conversation_style={style}" in lines[0]
    merged = yaml.safe_load((work / "workspace" / "output" / "kubetune-config.yaml").read_text())
    assert merged["dataset"]["_component_"] == CHAT
    summary = json.loads((work / "workspace" / "output" / "summary.json").read_text())
    assert summary["steps"] == 2
    assert (work / "workspace" / "export" / "adapter_model.safetensors").is_file()
