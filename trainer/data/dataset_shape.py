"""Which of torchtune's dataset builders reads the user's data, recognised from its
columns where the user named none.

The plan calls this only while the dataset builder is a shipped config's default (its
``alpaca_cleaned_dataset``): `kubetune local --dataset`, `kubetune train` without
``--dataset-type``, the byo-model runtime, an SDK job without a dataset config. A builder
the user named (``dataset=...``, ``dataset._component_=...``, their own config file) is
never replaced.

========================  ====================================  ===============================
shape                     columns (in the sampled rows)         builder
========================  ====================================  ===============================
chat, OpenAI style        a list of ``{role, content}`` each    our ``chat_dataset``, openai
chat, ShareGPT style      a list of ``{from, value}`` each      our ``chat_dataset``, sharegpt
chat, TRL prompt and      ``prompt`` and ``completion``, lists  our ``chat_dataset``, the
completion                of messages                           completion trained on
alpaca                    ``instruction``, ``output`` (+input)  the config's alpaca builder
instruct                  ``input``, ``output`` (or a known     ``instruct_dataset``
                          pair: prompt/completion, ...)
plain text                ``text``                              ``text_completion_dataset``
========================  ====================================  ===============================

A column map names the shape by its roles (``messages``/``conversations``: the column of
conversations, ``text``, ``instruction``, else ``input``/``output``), so
``KUBETUNE_COLUMN_MAP=messages=dialog`` is chat data in a column named ``dialog``; the
chat and text builders read their column by a key of their own, which the map becomes.
Each builder then trains as torchtune trains it (``chat_dataset``: the assistant turns
only, unless ``train_on_input``).

Chat data is read by ``kubetune.trainer.data.chat_dataset``: torchtune's ``chat_dataset``
with OpenAI's whole message grammar (tool calls, tool results, null and list contents)
and TRL's prompt-completion rows. It takes torchtune's parameters and gives the same
tokens for the rows torchtune reads, so a config's ``torchtune.datasets.chat_dataset`` is
read by it too (``reads_chat``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from kubetune.errors import BadInputError
from kubetune.trainer.config.component_params import component_params
from kubetune.trainer.config.config_keys import LOAD_DATASET_KEYS
from kubetune.trainer.data import column_map, conversations
from kubetune.trainer.data.dataset_check import DatasetSample
from kubetune.trainer.request.spelling import spelling

_DATASETS = "torchtune.datasets."
TORCHTUNE_CHAT, INSTRUCT, TEXT, ALPACA = (_DATASETS + name for name in (
    "chat_dataset", "instruct_dataset", "text_completion_dataset", "alpaca_dataset"))
CHAT = "kubetune.trainer.data.chat_dataset.chat_dataset"
_ALPACA_BUILDERS = {ALPACA, _DATASETS + "alpaca_cleaned_dataset"}
# The defaults detection may replace: builders of one of the shapes above (a preference
# or multimodal config's default reads data of another kind, and stays).
SHAPED_BUILDERS = {CHAT, TORCHTUNE_CHAT, INSTRUCT, TEXT, *_ALPACA_BUILDERS}
# TRL's conversational prompt-completion rows: the prompt column and the completion's.
_TRL_PROMPT, _TRL_COMPLETION = "prompt", "completion"
# The column-map roles naming the column of conversations (OpenAIToMessages' and
# ShareGPTToMessages' own names for it).
_CHAT_ROLES = ("messages", "conversations")
# Column pairs common enough to read as prompt and answer without a map.
_INSTRUCT_PAIRS = (("prompt", "completion"), ("prompt", "response"), ("question", "answer"))


@dataclass
class Shape:
    name: str
    component: str
    reads: str  # the columns, as the line shows them
    trains_on: str
    settings: dict[str, object] = field(default_factory=dict)  # None: the key is removed


def reads_chat(dataset_cfg: object) -> None:
    """torchtune's ``chat_dataset`` in a style ours reads becomes ours: the same
    parameters and, for the rows torchtune reads, the same tokens; the rows it would fail
    on with a traceback (a tool exchange, a null content) train or are dropped and
    counted instead."""
    if isinstance(dataset_cfg, DictConfig) \
            and str(dataset_cfg.get("_component_", "")) == TORCHTUNE_CHAT \
            and dataset_cfg.get("conversation_style") in conversations.MESSAGE_KEYS:
        dataset_cfg._component_ = CHAT


def may_detect(dataset_cfg: object, builder_named: bool) -> bool:
    """Whether the builder is a shipped config's default of a shape we recognise."""
    return (not builder_named and isinstance(dataset_cfg, DictConfig)
            and str(dataset_cfg.get("_component_", "")) in SHAPED_BUILDERS)


def choose(dataset_cfg: DictConfig, found: DatasetSample, spellings: dict[str, str]) -> str:
    """Set the dataset section to the builder the data's shape needs; return the line
    saying what was chosen and from which columns."""
    shape = detect(dataset_cfg, found, spellings)
    before = str(dataset_cfg.get("_component_"))
    dataset_cfg._component_ = shape.component
    for key, value in shape.settings.items():
        if value is None:
            dataset_cfg.pop(key, None)
        else:
            dataset_cfg[key] = value
    _check_keys(dataset_cfg, shape, spellings)
    settings = [f"{k}={v}" for k, v in shape.settings.items() if v is not None]
    if shape.component == before:
        settings.insert(0, "the config's default")
    with_settings = f" ({', '.join(settings)})" if settings else ""
    return (f"dataset: {shape.name} data (columns {shape.reads}) -> {shape.component}"
            f"{with_settings}; trains on {shape.trains_on}")


def detect(dataset_cfg: DictConfig, found: DatasetSample, spellings: dict[str, str]) -> Shape:
    """The shape of the sampled rows, as the column map (if any) names it."""
    columns = found.columns
    file_name = found.files[0].name
    mapping = column_map.read(dataset_cfg)
    map_spelling = spelling(spellings, column_map.KEY)
    one_column = next((r for r in (*_CHAT_ROLES, "text") if r in mapping), None)
    if one_column is not None:
        # The chat and text builders read one column, by a key the map becomes: checked
        # here, while the user's map is still there to name. Other maps are checked with
        # the builder's roles (`dataset_check`).
        only = {one_column: mapping[one_column]}
        if len(mapping) > 1:
            raise BadInputError(f"{map_spelling.name} maps {one_column}, the one column such "
                                f"data has, and other roles besides; set "
                                f"{column_map.write(map_spelling, only)}")
        column_map.check_columns_exist(only, columns, file_name, map_spelling)
    chat_column = dataset_cfg.get("conversation_column") or (
        mapping[one_column] if one_column in _CHAT_ROLES else None)
    if chat_column is None and not mapping:
        chat_column = _conversation_column(columns, found.rows)
    if chat_column is not None:
        return _chat(dataset_cfg, str(chat_column), found, spellings)
    if "text" in mapping:
        return _text(mapping["text"])
    present = set(columns)
    if "instruction" in mapping or (not mapping and {"instruction", "output"} <= present):
        inputs = mapping.get("input", "input")
        reads = [mapping.get("instruction", "instruction"),
                 *([inputs] if inputs in present else []), mapping.get("output", "output")]
        default = str(dataset_cfg.get("_component_"))
        component = default if default in _ALPACA_BUILDERS else ALPACA
        return Shape("alpaca", component, ", ".join(reads),
                     _trains_on(dataset_cfg, component, "the response",
                                "the prompt and the response"))
    if mapping or {"input", "output"} <= present:
        reads = f"{mapping.get('input', 'input')}, {mapping.get('output', 'output')}"
        return Shape("instruct", INSTRUCT, reads, _trains_on(dataset_cfg, INSTRUCT, "the output",
                                                            "the input and the output"))
    pair = next(((p, a) for p, a in _INSTRUCT_PAIRS if p in present and a in present), None)
    if pair is not None:
        return Shape("instruct", INSTRUCT, ", ".join(pair),
                     _trains_on(dataset_cfg, INSTRUCT, "the output",
                                "the input and the output"),
                     {"column_map": {"input": pair[0], "output": pair[1]}})
    if "text" in present:
        return _text("text")
    example = column_map.write(map_spelling, {"input": "<prompt column>",
                                              "output": "<answer column>"})
    raise BadInputError(
        f"dataset {file_name} has columns {', '.join(columns)}: not a shape the trainer "
        "recognises (instruction/input/output, input/output, a column of chat messages, "
        f"text): set {example}, or name a builder with dataset=...")


def _conversation_column(columns: list[str], rows: list[dict]) -> str | None:
    """The column whose sampled values are lists of messages (``messages``,
    ``conversations`` and ``prompt`` first)."""
    first = (*_CHAT_ROLES, _TRL_PROMPT)  # a TRL completion is never the conversation
    ordered = [c for c in first if c in columns] + [c for c in columns if c not in first]
    for column in ordered:
        value = next((row.get(column) for row in rows if row.get(column)), None)
        if conversations.style_of(value) is not None:
            return column
    return None


def _chat(dataset_cfg: DictConfig, column: str, found: DatasetSample,
          spellings: dict[str, str]) -> Shape:
    if column not in found.columns:
        named = spelling(spellings, "dataset.conversation_column")
        guess = column_map.nearest(column, found.columns)
        raise BadInputError(f"dataset {found.files[0].name} has no column {column!r} "
                            f"({named.name}); its columns are {', '.join(found.columns)}: "
                            f"set {named.assign(guess or '<column>')}")
    style = dataset_cfg.get("conversation_style")
    if style is None:
        value = next((row.get(column) for row in found.rows if row.get(column)), None)
        style = conversations.style_of(value)
        if style is None:
            raise BadInputError(
                f"dataset column {column!r} holds {str(value)[:60]!r}, not conversations: "
                "lists of {role, content} (OpenAI) or {from, value} (ShareGPT) messages")
    answers = "the assistant turns" if style == "openai" else "the gpt turns"
    settings = {"conversation_column": column, "conversation_style": style,
                "column_map": None}
    name = f"chat ({'OpenAI' if style == 'openai' else 'ShareGPT'} style)"
    completion = dataset_cfg.get("completion_column")
    if completion is None and column == _TRL_PROMPT and _TRL_COMPLETION in found.columns:
        completion = _TRL_COMPLETION
    if completion is not None:
        # TRL's conversational prompt-completion: only the completion is the answer.
        settings["completion_column"] = str(completion)
        name, column, answers = (f"chat prompt-completion (TRL, {style} style)",
                                 f"{column}, {completion}", "the completion")
    return Shape(name, CHAT, column,
                 _trains_on(dataset_cfg, CHAT, f"{answers} only", "every turn"), settings)


def _trains_on(dataset_cfg: DictConfig, component: str, answers: str, everything: str
               ) -> str:
    """What the loss covers: the answers, or with ``train_on_input`` (the builder's
    default where unset: alpaca's is True) the prompts too."""
    params = component_params(component)
    default = params.defaults.get("train_on_input") if params else False
    return everything if dataset_cfg.get("train_on_input", default) is True else answers


def _text(column: str) -> Shape:
    return Shape("plain text", TEXT, column, "all of the text",
                 {"column": column, "column_map": None})


def _check_keys(dataset_cfg: DictConfig, shape: Shape, spellings: dict[str, str]) -> None:
    """A dataset setting the chosen builder does not take would reach `datasets` as an
    argument it fails on: one line naming it as the user set it."""
    params = component_params(shape.component)
    if params is None:
        return
    taken = set(params.defaults) | LOAD_DATASET_KEYS | {"_component_"}
    for key in dataset_cfg.keys():
        if key not in taken:
            named = spelling(spellings, f"dataset.{key}")
            raise BadInputError(f"{named.name} does not apply to {shape.name} data "
                                f"({shape.component} takes no {key}): remove it, or name "
                                "the builder to use with dataset=...")
