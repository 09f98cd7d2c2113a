"""Which chat format a chat dataset trains in, chosen and checked before the first step.

``kubetune.chat_template`` (``KUBETUNE_CHAT_TEMPLATE``, ``--chat-template``): ``base``
renders conversations with the base model's own chat template (``tokenizer_config.json``'s
``chat_template`` or ``chat_template.jinja``) and tokenizes them with its
``tokenizer.json``, as transformers' ``apply_chat_template`` does; ``torchtune`` keeps
torchtune's format for the family. Unset: base where the base has a template (and a
``tokenizer.json`` to encode it with), else torchtune's. The template's text goes into the
dataset config (``dataset.chat_template``), so the token cache keys on it and the saved
config records it.

Before any step, a few of the data's rows are rendered as training will render them and
held to the exporter's rule (``kubetune.chat_template.parity``): the template the export
will carry renders the training ids exactly. A mismatch is one exit 65 naming the other
value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kubetune import env
from kubetune.chat_template import render as rendering
from kubetune.chat_template.parity import sample_problem
from kubetune.errors import BadInputError
from kubetune.trainer.data import dataset_shape
from kubetune.trainer.request.spelling import Spelling, spelling

MODES = ("base", "torchtune")
KEY = "kubetune.chat_template"  # what KUBETUNE_CHAT_TEMPLATE and --chat-template set
# The builder of a checkpoint's tokenizer.json (trainer/models/fast_tokenizer.py): it renders
# the base's template itself, and torchtune has no format of its own for it.
FAST_TOKENIZER = ".fast_tokenizer.fast_tokenizer"
CHECKED_ROWS = 8  # sampled rows rendered before the first step
# torchtune's tokenizer builders whose format the exporter can write as a chat template,
# and their tokenizer classes.
_EXPORTABLE = {"llama3_tokenizer": "torchtune.models.llama3._tokenizer.Llama3Tokenizer",
               "qwen2_tokenizer": "torchtune.models.qwen2._tokenizer.Qwen2Tokenizer",
               "qwen2_5_tokenizer": "torchtune.models.qwen2_5._tokenizer.Qwen2_5Tokenizer"}


def _mode(cfg: DictConfig, spellings: dict[str, str]) -> str | None:
    mode = OmegaConf.select(cfg, KEY)
    if mode is not None and str(mode) not in MODES:
        # Named as set: the option's and the variable's values are click's choices, so
        # this is most often a `tune run` override, named by its key.
        raise BadInputError(f"{spelling(spellings, KEY).assign(str(mode))} is not one of "
                            f"{', '.join(MODES)}")
    return None if mode is None else str(mode)


def _encodes(model_dir: Path) -> str | None:
    """Why the base's tokenizer.json cannot encode a rendered template; None: it can."""
    if not (model_dir / rendering.TOKENIZER_JSON).is_file():
        return f"the base model has no {rendering.TOKENIZER_JSON}"
    try:
        rendering.TextTokenizer(model_dir)
    except Exception as exc:  # the tokenizers library's own error: one line of it
        return f"its {rendering.TOKENIZER_JSON} does not load ({str(exc).splitlines()[0][:80]})"
    return None


def _torchtune_note(cfg: DictConfig, why: str) -> list[str]:
    builder = str(OmegaConf.select(cfg, "tokenizer._component_") or "").rsplit(".", 1)[-1]
    notes = [f"chat template: torchtune's format for {builder or 'the tokenizer'} ({why})"]
    if builder not in _EXPORTABLE:
        notes.append(f"chat template: the export will carry no chat template: the base model "
                     f"has none and torchtune's {builder} format has none to write; prompt "
                     "the exported model as torchtune formatted the training data")
    return notes


def plan(cfg: DictConfig, model_dir: Path, found: Any,
         spellings: dict[str, str] | None = None) -> list[str]:
    """Set ``dataset.chat_template`` where conversations train in the base's template; the
    plan's notes say which format and why. ``spellings``: the option or variable that set
    ``kubetune.chat_template``, named where its value is refused."""
    dataset = cfg.get("dataset")
    if not isinstance(dataset, DictConfig) or \
            str(dataset.get("_component_", "")) != dataset_shape.CHAT:
        return []
    mode, model_dir = _mode(cfg, spellings or {}), Path(model_dir)
    said = spelling(spellings or {}, KEY)
    base = rendering.find_template(model_dir)
    if mode == "torchtune":
        if str(OmegaConf.select(cfg, "tokenizer._component_") or "").endswith(FAST_TOKENIZER):
            raise BadInputError(f"{said.assign('torchtune')}: torchtune has no chat format for "
                                "this checkpoint's tokenizer (its tokenizer.json alone): leave "
                                "it unset to train in the base's own template")
        if base is not None:
            _check_torchtune_prompts(cfg, base.text, model_dir, found, said)
        return _torchtune_note(cfg, said.assign("torchtune"))
    if base is None:
        if mode == "base":
            raise BadInputError(f"{said.assign('base')}: the base model ({model_dir}) has no "
                                f"chat template (no {rendering.TEMPLATE_FILE}, no chat_template "
                                f"in {rendering.TOKENIZER_CONFIG}): set "
                                f"{said.assign('torchtune')}")
        return _torchtune_note(cfg, "the base model has no chat template")
    unusable = _encodes(model_dir)
    if unusable is not None:
        if mode == "base":
            raise BadInputError(f"{said.assign('base')}: {unusable}, which the base's chat "
                                f"template is tokenized with: set {said.assign('torchtune')}")
        return _torchtune_note(cfg, f"the base model has a chat template, but {unusable}")
    dataset.chat_template = base.text
    dataset.chat_template_dir = str(model_dir)
    checked = _check_rows(dataset, base.text, model_dir, found)
    return [f"chat template: the base model's own ({base.where}), as transformers' "
            f"apply_chat_template renders it{' ' + checked if checked else ''} "
            f"({'asked for' if mode else 'the default where the base has one'}; "
            f"{env.CHAT_TEMPLATE}=torchtune for torchtune's format)"]


def _check_rows(dataset: DictConfig, template: str, model_dir: Path, found: Any) -> str:
    """A few rows as training will tokenize them, held to the exporter's rule; what was
    checked, for the plan's line."""
    from kubetune.trainer.data.chat_dataset import ChatTransform
    from kubetune.trainer.data.chat_messages import RowDropped
    from kubetune.trainer.data.chat_template_tokens import as_chat

    rows = list(getattr(found, "rows", None) or [])[:CHECKED_ROWS]
    if not rows:
        return ""
    transform = ChatTransform(
        None, str(dataset.get("conversation_column") or "messages"),
        str(dataset.get("conversation_style") or "openai"), dataset.get("completion_column"),
        bool(dataset.get("train_on_input") or False), dataset.get("new_system_prompt"),
        template, str(model_dir))
    encoder, named = transform.template.encoder, transform.template.named
    stops = {i for i in (encoder.token_id(named.get("eos_token") or ""),) if i is not None}
    refused: dict[str, int] = {}
    for number, row in enumerate(rows, start=1):
        try:
            messages = transform.messages(row)
            tokens, _ = transform.template.tokenize(messages)
        except RowDropped as exc:
            refused[str(exc)] = refused.get(str(exc), 0) + 1
            continue
        chat = [as_chat(m) for m in messages]
        if chat[-1]["role"] != "assistant":
            continue
        problem = sample_problem(template, number, _Sample(chat, tokens), encoder, named, stops,
                                 False)
        if problem is not None:
            raise BadInputError(f"the base model's chat template would not prompt the export as "
                                f"training feeds it: {problem}; set {env.CHAT_TEMPLATE}="
                                "torchtune, or give the data in the base's format")
    if len(refused) and sum(refused.values()) == len(rows):
        reason, count = max(refused.items(), key=lambda item: item[1])
        raise BadInputError(f"the base model's chat template refuses every row sampled "
                            f"({len(rows)}; {count} with {reason}): set {env.CHAT_TEMPLATE}="
                            "torchtune, or give conversations the template accepts")
    kept = len(rows) - sum(refused.values())
    return f"(checked on {kept} of {len(rows)} sampled row(s))"


class _Sample:
    """A conversation and its training ids, as the exporter's samples hold them."""

    def __init__(self, messages: list[dict], tokens: list[int]) -> None:
        self.messages, self.tokens = messages, tokens


def _check_torchtune_prompts(cfg: DictConfig, template: str, model_dir: Path, found: Any,
                             said: Spelling) -> None:
    """torchtune's format asked for on a base with its own template: the export keeps the
    base's only where it prompts as torchtune's format does. Compared on the sampled rows'
    prompts, as text, where torchtune's format is known as a template. ``said``: the
    setting as the user set it."""
    import jinja2

    from kubetune.chat_template.torchtune_formats import trained_template

    builder = str(OmegaConf.select(cfg, "tokenizer._component_") or "").rsplit(".", 1)[-1]
    named = rendering.named_tokens(model_dir)
    ours = trained_template(_EXPORTABLE.get(builder, ""), None, named.get("bos_token"),
                            named.get("eos_token") or "")
    rows = list(getattr(found, "rows", None) or [])[:CHECKED_ROWS]
    column = str(cfg.dataset.get("conversation_column") or "messages")
    if ours is None or cfg.dataset.get("conversation_style", "openai") != "openai":
        return
    for number, row in enumerate(rows, start=1):
        chat = row.get(column) if isinstance(row, dict) else None
        if not isinstance(chat, list) or not chat or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in chat):
            continue
        prompt = chat[:-1] if chat[-1].get("role") == "assistant" else chat
        try:
            theirs = rendering.render(template, prompt, True, named)
            mine = rendering.render(ours, prompt, True, named)
        except jinja2.TemplateError:
            continue
        if theirs != mine:
            at = next((i for i, (a, b) in enumerate(zip(theirs, mine)) if a != b),
                      min(len(theirs), len(mine)))
            raise BadInputError(
                f"{said.assign('torchtune')}: the base model's chat template prompts "
                f"sampled row {number} otherwise than torchtune's {builder} format (at "
                f"character {at}: {theirs[at:at + 40]!r} where training would have "
                f"{mine[at:at + 40]!r}), so its export would not answer as trained: set "
                f"{said.assign('base')}")
