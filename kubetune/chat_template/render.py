"""A tokenizer directory's chat template, found and rendered as transformers does it, and
its text turned into ids by the directory's ``tokenizer.json`` (transformers'
``apply_chat_template`` tokenizes the rendered text without adding special tokens).

Without transformers (the exporter's image has none): jinja2 (which torch brings) in the
environment transformers builds (sandboxed, ``trim_blocks``, ``lstrip_blocks``, loop
controls, ``raise_exception``, ``strftime_now``, its ``tojson``), given the tokenizer's
named special tokens as transformers passes them. tests/test_chat_template.py renders the
same templates with transformers' own ``apply_chat_template`` and compares.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from kubetune.errors import BadInputError

# transformers 5 reads a chat_template.jinja before tokenizer_config.json's entry.
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_JSON = "tokenizer.json"
# The named special tokens transformers gives a template (its SPECIAL_TOKENS_ATTRIBUTES).
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                "mask_token")


@dataclass(frozen=True)
class FoundTemplate:
    text: str
    where: str  # the file it came from, for messages


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{path} is unreadable ({exc}): the base model's tokenizer files "
                            "are damaged; fetch the model again") from None
    return found if isinstance(found, dict) else {}


def find_template(tokenizer_dir: Path) -> FoundTemplate | None:
    """The template transformers would use for ``tokenizer_dir``, or None when it has none."""
    jinja_file = Path(tokenizer_dir) / TEMPLATE_FILE
    if jinja_file.is_file():
        return FoundTemplate(jinja_file.read_text(), TEMPLATE_FILE)
    entry = _read_json(Path(tokenizer_dir) / TOKENIZER_CONFIG).get("chat_template")
    if isinstance(entry, list):  # named templates: transformers' default is "default"
        entry = next((t.get("template") for t in entry
                      if isinstance(t, dict) and t.get("name") == "default"), None)
    return FoundTemplate(entry, TOKENIZER_CONFIG) if isinstance(entry, str) and entry else None


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # an AddedToken as tokenizer_config.json writes it
        value = value.get("content")
    return value if isinstance(value, str) else None


def named_tokens(tokenizer_dir: Path) -> dict[str, str]:
    """``bos_token``, ``eos_token``, ... as the template sees them: tokenizer_config.json's,
    else special_tokens_map.json's."""
    config = _read_json(Path(tokenizer_dir) / TOKENIZER_CONFIG)
    legacy = _read_json(Path(tokenizer_dir) / "special_tokens_map.json")
    named = {}
    for name in NAMED_TOKENS:
        text = _token_text(config.get(name)) if name in config else _token_text(legacy.get(name))
        if text is not None:
            named[name] = text
    return named


@lru_cache(maxsize=8)
def _compiled(template: str):
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        # transformers' {% generation %} marks assistant text for its masks; rendering
        # is unchanged by it.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body
                                          ).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[Generation, loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return environment.from_string(template)


def render(template: str, messages: list[dict[str, str]], add_generation_prompt: bool,
           tokens: dict[str, str]) -> str:
    """``messages`` through ``template``, as ``apply_chat_template(tokenize=False)``;
    ``tokens``: the named special tokens (``named_tokens``). A template that fails raises
    jinja2's TemplateError."""
    return _compiled(template).render(messages=messages, tools=None, documents=None,
                                      add_generation_prompt=add_generation_prompt, **tokens)


class TextTokenizer:
    """A directory's ``tokenizer.json``, encoding rendered text as transformers does."""

    def __init__(self, tokenizer_dir: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / TOKENIZER_JSON))

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encoding(self, text: str):
        """The tokenizers library's Encoding (ids and each token's character offsets)."""
        return self._tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def added_ids(self) -> set[int]:
        """The ids of the added tokens (the special ones a template writes: turn markers)."""
        return set(self._tokenizer.get_added_tokens_decoder())
