"""Look at the dataset files before launch: do their columns fit the recipe's dataset
builder and column map, and how long are the samples and how many rows are there (for
the packing default)?

Reads only schemas, row counts from metadata or a streamed newline count, and a few
hundred rows spread over up to ``_SAMPLED_FILES`` shards (``kubetune.trainer.data.dataset_rows``),
never the whole set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.errors import BadInputError
from kubetune.suggest import closest
from kubetune.trainer.data import column_map, conversations
from kubetune.trainer.request.spelling import Spelling, spelling
from kubetune.trainer.data.dataset_rows import FORMAT_OF_SUFFIX, look

_SUFFIXES = FORMAT_OF_SUFFIX
_SAMPLE_ROWS = 512
# Shards sampled for lengths (first, last and evenly between): shards are often split by
# source or length, so one shard alone can misrepresent the set.
_SAMPLED_FILES = 8
_MIN_ROWS_PER_FILE = 64


@dataclass
class DatasetSample:
    files: list[Path]
    columns: list[str]
    rows: list[dict]  # about _SAMPLE_ROWS rows, the first of each sampled file
    total_rows: int | None  # over every file; None when a file's format cannot say
    rows_exact: bool = False  # total_rows counted, not estimated


def split_names(split) -> list[str]:
    """The split names a ``dataset.split`` value reads (``train[:90%]+validation`` ->
    train, validation); ``train`` when it names none."""
    names = [m["name"] for m in (_SPLIT_PART.fullmatch(p.strip())
                                 for p in str(split or "train").split("+")) if m]
    return names or ["train"]


def split_rows(split, total: int | None) -> int | None:
    """The rows ``dataset.split`` reads of the ``total`` its splits' files hold: a slice
    (``train[:90%]``) as ``datasets`` cuts it; None where a slice spans several splits."""
    text = str(split or "train")
    if total is None or "[" not in text:
        return total
    if "+" in text:
        return None  # each split's own count would be needed
    from datasets import ReadInstruction

    try:
        cuts = ReadInstruction.from_spec(text).to_absolute({split_names(text)[0]: total})
    except (ValueError, AssertionError):
        return None  # check_split names what is wrong with it
    return sum(max(0, cut.to - cut.from_) for cut in cuts)


def _files(dataset_cfg: DictConfig, every_split: bool = False) -> list[Path]:
    """The data files the builder reads: those of the split(s) ``dataset.split`` names
    where ``data_files`` maps splits to files (``every_split``: all of them)."""
    data_files = dataset_cfg.get("data_files")
    if data_files:
        if isinstance(data_files, str):
            return [Path(data_files)]
        container = OmegaConf.to_container(data_files) if not isinstance(data_files, list) \
            else data_files
        if isinstance(container, dict):
            wanted = set(container) if every_split else set(split_names(
                dataset_cfg.get("split")))
            flat = []
            for split, v in container.items():
                if split in wanted:
                    flat += [v] if isinstance(v, str) else list(v)
            return [Path(f) for f in flat]
        return [Path(str(f)) for f in container]
    data_dir = dataset_cfg.get("data_dir")
    if data_dir:
        return sorted(p for p in Path(str(data_dir)).rglob("*")
                      if p.suffix in _SUFFIXES and p.is_file()
                      and not any(part.startswith(".") for part in p.parts[-2:]))
    return []


def _spread(files: list[Path], k: int) -> list[Path]:
    if len(files) <= k:
        return files
    return [files[round(i * (len(files) - 1) / (k - 1))] for i in range(k)]


def _of_source(dataset_cfg: DictConfig, files: list[Path]) -> list[Path]:
    """The files the builder named by ``dataset.source`` reads (``datasets``' saved
    arrow sets hold ``state.json`` and ``dataset_info.json`` beside the data)."""
    kind = FORMAT_OF_SUFFIX.get("." + str(dataset_cfg.get("source", "")))
    matching = [f for f in files if FORMAT_OF_SUFFIX.get(f.suffix) == kind]
    return matching or files


def sample_files(dataset_cfg: DictConfig) -> list[Path]:
    """Every data file of every split the dataset names locally (none: nothing to check)."""
    return _of_source(dataset_cfg, _files(dataset_cfg, every_split=True))


def sample(dataset_cfg: DictConfig) -> DatasetSample | None:
    """The training split's files (``dataset.split``'s), sampled and counted."""
    if not isinstance(dataset_cfg, DictConfig):
        return None
    files = _of_source(dataset_cfg, _files(dataset_cfg))
    if not files:
        return None
    sampled = set(_spread(files, _SAMPLED_FILES))
    per_file = max(_MIN_ROWS_PER_FILE, _SAMPLE_ROWS // len(sampled))
    columns: list[str] | None = None
    rows: list[dict] = []
    total: int | None = 0
    exact = True
    for path in files:
        found = look(path, per_file if path in sampled else 0)
        if columns is None:
            columns = found.columns
        rows += found.rows
        total = None if total is None or found.count is None else total + found.count
        exact = exact and found.exact
    return DatasetSample(files=files, columns=columns or [], rows=rows, total_rows=total,
                         rows_exact=exact and total is not None)


def required_columns(dataset_cfg: DictConfig,
                     spelling: Spelling = column_map.BY_KEY) -> dict[str, str]:
    """Column the builder reads -> its role, after the column map, for builders we know."""
    component = str(dataset_cfg.get("_component_", ""))
    name = component.rsplit(".", 1)[-1]
    mapping = column_map.read(dataset_cfg)
    roles: tuple[str, ...]
    if name == "instruct_dataset":
        roles = ("input", "output")
    elif name in ("alpaca_dataset", "alpaca_cleaned_dataset"):
        roles = ("instruction", "input", "output")
    elif name == "text_completion_dataset":
        return {str(dataset_cfg.get("column", "text")): "text"}
    elif name == "chat_dataset":
        column = dataset_cfg.get("conversation_column")
        if not column:
            raise BadInputError("dataset chat_dataset needs dataset.conversation_column: the "
                                "column that holds each conversation")
        completion = dataset_cfg.get("completion_column")  # TRL's prompt-completion rows
        return {str(column): "conversation",
                **({str(completion): "completion"} if completion else {})}
    else:
        return {}
    _check_column_map(name, mapping, roles, spelling)
    return {str(mapping.get(role, role)): role for role in roles}


# The roles a builder's message transform reads from column_map; instruct_dataset's
# (InputOutputToMessages) wants every one of them once a map is given, and reads "image".
_EXTRA_ROLES = {"instruct_dataset": ("image",)}
_MAP_NEEDS_ALL = {"instruct_dataset"}
# alpaca's transform writes a prompt without the input where a row has none.
_OPTIONAL_ROLES = {"alpaca_dataset": ("input",), "alpaca_cleaned_dataset": ("input",)}


def _check_column_map(name: str, mapping: dict, roles: tuple[str, ...],
                      spelling: Spelling) -> None:
    """A key the transform does not read is a typo it would ignore or die on (torchtune:
    "Expected a key of 'input' in column_map"): one line naming it, before the recipe."""
    known = roles + _EXTRA_ROLES.get(name, ())
    example = column_map.write(spelling, {r: "<column>" for r in roles})
    for key, column in mapping.items():
        if key not in known:
            guess = closest(str(key), set(known))
            hint = f" (did you mean {guess}?)" if guess else ""
            raise BadInputError(f"{spelling.name} key {key!r}{hint}: {name} reads the roles "
                                f"{', '.join(known)}; set {example}")
        if not isinstance(column, str) or not column:
            raise BadInputError(f"{spelling.name} {key}={column!r}: must name a column; "
                                f"set {example}")
    missing = [r for r in roles if r not in mapping]
    if mapping and name in _MAP_NEEDS_ALL and missing:
        raise BadInputError(f"{spelling.name} lacks {', '.join(missing)}: {name} reads every "
                            f"role from the map once one is given; set {example}")


# The builders that read one column by a key of their own, not through column_map.
_COLUMN_KEYS = {"conversation": "dataset.conversation_column", "text": "dataset.column"}


def check_columns(dataset_cfg: DictConfig, found: DatasetSample,
                  spellings: dict[str, str] | None = None) -> None:
    """The columns the builder reads are in the data and hold what it reads; a hint names
    the setting the user gave (``spellings``: config key -> the variable or option that
    set it)."""
    spellings = spellings or {}
    map_spelling = spelling(spellings, column_map.KEY)
    if found.total_rows == 0 or (found.total_rows is None and not found.rows):
        # datasets fails on it with "An error occurred while generating the dataset".
        raise BadInputError(f"the dataset's files ({found.files[0].name}"
                            f"{' ...' if len(found.files) > 1 else ''}) hold no rows")
    required = required_columns(dataset_cfg, map_spelling)
    name = str(dataset_cfg.get("_component_", "")).rsplit(".", 1)[-1]
    column_map.check_columns_exist(column_map.read(dataset_cfg), found.columns,
                                   found.files[0].name, map_spelling)
    optional = _OPTIONAL_ROLES.get(name, ())
    missing = [col for col in required if col not in found.columns
               and required[col] not in optional]
    if missing:
        roles = ", ".join(f"{required[c]}->{c}" for c in missing)
        role = required[missing[0]]
        guess = column_map.nearest(missing[0], found.columns) or "<column>"
        if role in _COLUMN_KEYS:
            fix = spelling(spellings, _COLUMN_KEYS[role]).assign(guess)
        else:
            fix = column_map.write(map_spelling, {required[c]: column_map.nearest(
                c, found.columns) or "<column>" for c in missing})
        raise BadInputError(
            f"dataset {found.files[0].name} has columns {found.columns} but {name} reads "
            f"{roles}: set {fix}")
    present = {c: r for c, r in required.items() if c in found.columns}
    _check_text_values(present, found, optional)
    _check_conversations(present, str(dataset_cfg.get("conversation_style", "")), found)


def _check_text_values(required: dict[str, str], found: DatasetSample,
                       optional: tuple[str, ...] = ()) -> None:
    """The text roles hold text: a column with no text in any sampled row is the wrong
    column (torchtune's transforms die on a null or a number). A few such rows among
    good ones are the trainer's to drop and count (``token_cache.build``); an optional
    role (alpaca's input) may be null, as torchtune reads it."""
    for column, role in required.items():
        if role in ("conversation", "completion") or role in optional:
            continue  # messages (or a TRL completion's text): the chat builder's to read
        if any(isinstance(row.get(column), str) for row in found.rows):
            continue
        for number, row in enumerate(found.rows, 1):
            value = row.get(column)
            if value is None:
                raise BadInputError(f"dataset column {column!r} ({role}) is empty (null) in "
                                    f"sampled row {number}: fill or drop such rows")
            if not isinstance(value, str):
                raise BadInputError(f"dataset column {column!r} ({role}) holds "
                                    f"{type(value).__name__} values, not text (sampled row "
                                    f"{number}: {value!r}): convert the column to strings")


def _check_conversations(required: dict[str, str], style: str, found: DatasetSample) -> None:
    """The conversation column holds conversations in the style the builder reads: a
    message without its keys, or a ShareGPT speaker torchtune does not map, fails in the
    recipe's transform."""
    if style not in conversations.MESSAGE_KEYS:
        return  # chat_dataset's own error names the styles it takes
    for column, role in required.items():
        if role != "conversation":
            continue
        problems = [conversations.problem(row.get(column), style) for row in found.rows]
        if not all(problems):
            continue  # a few bad rows are the chat builder's to drop and count
        for number, why in enumerate(problems, 1):
            if why:
                raise BadInputError(f"dataset column {column!r} (conversations) in sampled "
                                    f"row {number}: {why}; fix such rows or set "
                                    "dataset.conversation_style to the data's style")


def mean_chars(dataset_cfg: DictConfig, found: DatasetSample) -> float | None:
    columns = list(required_columns(dataset_cfg)) or found.columns
    if not found.rows:
        return None
    total = 0
    for row in found.rows:
        total += sum(len(str(row.get(c, ""))) for c in columns)
    return total / len(found.rows)


# datasets' split syntax: name, name[a:b] with whole numbers or percents, joined by "+".
_SPLIT_PART = re.compile(r"(?P<name>[\w.\-]+)(?:\[\s*(?:-?\d+%?)?\s*(?::\s*(?:-?\d+%?)?\s*)?"
                         r"(?:\((?:closest|pct1_dropremainder)\))?\])?")
# How datasets names the splits of a folder of files (its default data-file patterns):
# a keyword in a file or folder name, else every file is "train".
_SPLIT_WORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "val", "dev"),
                "test": ("test", "testing", "eval", "evaluation")}
_WORD_EDGE = r"(?:^|[/_\-. ])({})(?:[/_\-. 0-9]|$)"


def _local_splits(dataset_cfg: DictConfig, files: list[Path]) -> set[str]:
    data_files = dataset_cfg.get("data_files")
    if isinstance(data_files, DictConfig):
        return {str(k) for k in data_files.keys()}
    if data_files:
        return {"train"}  # a list or a single file: datasets names it train
    base = Path(str(dataset_cfg.get("data_dir") or ""))
    found = set()
    for split, words in _SPLIT_WORDS.items():
        pattern = re.compile(_WORD_EDGE.format("|".join(words)), re.IGNORECASE)
        if any(pattern.search(str(f.relative_to(base)) if f.is_relative_to(base) else f.name)
               for f in files):
            found.add(split)
    return found or {"train"}


def splits(dataset_cfg: DictConfig) -> set[str]:
    """The splits the dataset's local files give, as ``datasets`` names them."""
    return _local_splits(dataset_cfg, sample_files(dataset_cfg))


def check_split(dataset_cfg: DictConfig, what: str = "dataset.split",
                spellings: dict[str, str] | None = None) -> None:
    """``dataset.split`` reads in datasets' syntax and names a split the local files
    have: a wrong one fails in the recipe ("Unknown split", "Unrecognized instruction").
    ``what``: its key; named in the message as the user set it (``spellings``: --split,
    KUBETUNE_DATASET_SPLIT), else by the key."""
    text = str(dataset_cfg.get("split") or "train")
    said = spelling(spellings or {}, what)
    parts = [p.strip() for p in text.split("+")]
    bad = next((p for p in parts if not _SPLIT_PART.fullmatch(p)), None)
    if bad is not None:
        raise BadInputError(f"{said.assign(text)}: {bad!r} is not a split; write a name with "
                            "an optional slice, e.g. train, train[:90%], train[100:200]")
    found = splits(dataset_cfg)
    unknown = next((_SPLIT_PART.fullmatch(p)["name"] for p in parts
                    if _SPLIT_PART.fullmatch(p)["name"] not in found), None)
    if unknown is not None:
        shown = ", ".join(sorted(found, key=_split_order))
        raise BadInputError(f"{said.assign(text)}: the dataset has no split {unknown!r}; its "
                            f"files give {shown}: use one of them, e.g. "
                            f"{said.assign(sorted(found, key=_split_order)[0])}")


def _split_order(split: str) -> tuple[int, str]:
    """train, validation, test first, as ``datasets`` lists them; others by name."""
    order = list(_SPLIT_WORDS)
    return (order.index(split) if split in order else len(order), split)
