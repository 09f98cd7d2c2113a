"""A checkpoint's Hugging Face fast tokenizer (``tokenizer.json``) as a torchtune
``ModelTokenizer``: the tokenizer most checkpoints on the hub ship, where the family's own
files (Llama 3's ``original/tokenizer.model``, Qwen's ``vocab.json`` + ``merges.txt``, a
sentencepiece ``tokenizer.model``) are absent.

Text is encoded by the ``tokenizers`` library (which transformers' fast tokenizers wrap).
The special tokens are the ones transformers reads: ``bos_token``, ``eos_token`` and
``pad_token`` from ``tokenizer_config.json`` (else ``special_tokens_map.json``), the ids
``generate`` stops at from ``generation_config.json``'s ``eos_token_id`` (an int or a
list) with the tokenizer's EOS. A BOS is added where transformers adds one: the
config's ``add_bos_token`` where it says, else where ``tokenizer.json``'s post-processor
puts it. Conversations are rendered in the checkpoint's own chat template, as
``apply_chat_template`` does (``kubetune.trainer.data.chat_template_tokens``); a checkpoint
with none gets torchtune's plain format (each message's text, BOS before a turn, EOS after
an answer), after a ``prompt_template`` where one is given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from torchtune.data import Message, PromptTemplate, truncate
from torchtune.modules.transforms import Transform
from torchtune.modules.transforms.tokenizers import ModelTokenizer
from torchtune.modules.transforms.tokenizers._utils import tokenize_messages_no_special_tokens

from kubetune.chat_template import render as rendering

# The token cache keys on these modules' source too (token_cache.key).
TOKENS_DEPEND_ON = ("kubetune.chat_template.render",
                    "kubetune.trainer.data.chat_template_tokens")


def _json(path: str | None) -> dict:
    if not path or not Path(path).is_file():
        return {}
    found = json.loads(Path(path).read_text())
    return found if isinstance(found, dict) else {}


def _ids(value: Any) -> list[int]:
    """generation_config's ``eos_token_id``: an int, a list of them, or absent."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


class FastTokenizer(ModelTokenizer, Transform):
    """``tokenizer.json`` + its configs -> torchtune's tokenizer interface."""

    def __init__(self, path: str, tokenizer_config_path: str | None = None,
                 generation_config_path: str | None = None, chat_template_path: str | None = None,
                 max_seq_len: int | None = None,
                 prompt_template: PromptTemplate | None = None) -> None:
        from tokenizers import Tokenizer

        self.tokenizer_model = Tokenizer.from_file(str(path))
        self.directory = Path(path).parent
        self.max_seq_len, self.prompt_template = max_seq_len, prompt_template
        config = _json(tokenizer_config_path)
        generation = _json(generation_config_path)
        # Named tokens as transformers reads them (tokenizer_config, else the legacy map).
        config_dir = Path(tokenizer_config_path).parent if tokenizer_config_path else None
        self.named = rendering.named_tokens(config_dir or self.directory)
        added = self.tokenizer_model.get_added_tokens_decoder()
        self.special_tokens = {t.content: int(i) for i, t in added.items() if t.special}
        self.bos_id = self._id_of("bos_token", _ids(generation.get("bos_token_id")))
        self.eos_id = self._id_of("eos_token", _ids(generation.get("eos_token_id")))
        self.pad_id = self._id_of("pad_token", _ids(generation.get("pad_token_id")))
        if self.pad_id is None:  # padding is never trained on: any real id serves
            self.pad_id = self.eos_id if self.eos_id is not None else 0
        stops = [self.eos_id] + _ids(generation.get("eos_token_id"))
        self.stop_tokens = list(dict.fromkeys(t for t in stops if t is not None))
        self.add_bos = self._adds("add_bos_token", config, self.bos_id)
        self.template = None
        text = Path(chat_template_path).read_text() if chat_template_path else None
        found = rendering.find_template(self.directory) if text is None else None
        text = text or (found.text if found else None)
        if text:
            from kubetune.trainer.data.chat_template_tokens import TemplateTokenizer

            self.template = TemplateTokenizer(text, self.directory, None)

    def _id_of(self, name: str, fallback: list[int]) -> int | None:
        token = self.named.get(name)
        found = self.tokenizer_model.token_to_id(token) if token else None
        return found if found is not None else (fallback[0] if fallback else None)

    def _adds(self, key: str, config: dict, token: int | None) -> bool:
        """Whether transformers' encode adds ``token`` (BOS) to a text."""
        if token is None:
            return False
        if isinstance(config.get(key), bool):
            return bool(config[key])
        return token in self.tokenizer_model.encode("", add_special_tokens=True).ids

    @property
    def vocab_size(self) -> int:
        return self.tokenizer_model.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True,
               trim_leading_whitespace: bool = False) -> list[int]:
        ids = self.tokenizer_model.encode(text, add_special_tokens=False).ids
        if add_bos and self.add_bos:
            ids.insert(0, self.bos_id)
        if add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer_model.decode([int(t) for t in token_ids],
                                           skip_special_tokens=skip_special_tokens)

    def tokenize_messages(self, messages: list[Message], add_end_tokens: bool = True,
                          **_: Any) -> tuple[list[int], list[bool]]:
        """In the checkpoint's chat template where it has one; without end tokens (a
        prompt to answer), up to the template's generation prompt."""
        if self.prompt_template is not None:
            messages = self.prompt_template(messages)
        if self.template is None:
            return tokenize_messages_no_special_tokens(
                self, messages, bos_id=self.bos_id if self.add_bos else None,
                eos_id=self.eos_id if add_end_tokens else None)
        if not add_end_tokens:
            return self._prompt(messages)
        tokens, mask = self.template.tokenize(messages)
        if self.max_seq_len is not None and len(tokens) > self.max_seq_len:
            tokens, mask = tokens[:self.max_seq_len], mask[:self.max_seq_len]
        return tokens, mask

    def _prompt(self, messages: list[Message]) -> tuple[list[int], list[bool]]:
        from kubetune.trainer.data.chat_template_tokens import as_chat

        chat = [as_chat(m) for m in messages]
        if chat and chat[-1]["role"] == "assistant" and not chat[-1]["content"]:
            chat = chat[:-1]  # torchtune's generate: an empty answer to fill
        text = rendering.render(self.template.template, chat, True, self.template.named)
        tokens = self.template.encoder.encode(text)
        return tokens, [True] * len(tokens)

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> Mapping[str, Any]:
        tokens, mask = self.tokenize_messages(sample.pop("messages"),
                                              add_end_tokens=not inference)
        sample["tokens"], sample["mask"] = tokens, mask
        return sample


def fast_tokenizer(path: str, tokenizer_config_path: str | None = None,
                 generation_config_path: str | None = None, chat_template_path: str | None = None,
                 max_seq_len: int | None = None,
                 prompt_template: Any = None) -> FastTokenizer:
    """The builder a config names (``tokenizer._component_``); ``prompt_template`` as
    torchtune's builders take it (a dotted path, a dict of role tags, or an instance)."""
    if prompt_template is not None and not callable(prompt_template):
        from torchtune.data._prompt_templates import _get_prompt_template

        prompt_template = _get_prompt_template(prompt_template)
    return FastTokenizer(path, tokenizer_config_path, generation_config_path, chat_template_path,
                       max_seq_len, prompt_template)
