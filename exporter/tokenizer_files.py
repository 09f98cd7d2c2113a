"""The tokenizer files and generation config beside an exported model or adapter: the base
model's own, with the chat template and the stop tokens the run was trained with
(``chat_format``). The adapter and the merged model carry the same ones, so a user loads
the tokenizer from the export whichever they serve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kubetune.chat_template import render as rendering
from kubetune.errors import BadInputError
from kubetune.exporter.chat_format import ChatFormat
from kubetune.workspace.model_files import read_config

TOKENIZER_FILES = (rendering.TOKENIZER_JSON, rendering.TOKENIZER_CONFIG,
                   "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "original/tokenizer.model", rendering.TEMPLATE_FILE)
GENERATION_CONFIG_NAME = "generation_config.json"


def _ids(value) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def generation_config(model_dir: Path, stop_token_ids: list[int]) -> dict | None:
    """The base's generation config (else config.json's token ids, as transformers derives
    one), its ``eos_token_id`` extended by ``stop_token_ids``; None when neither is needed."""
    path = Path(model_dir) / GENERATION_CONFIG_NAME
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BadInputError(f"{path} is unreadable ({exc}): the base model's files are "
                                "damaged; fetch the model again") from None
    elif stop_token_ids:
        model = read_config(Path(model_dir))
        config = {k: model[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                  if model.get(k) is not None}
    else:
        return None
    if stop_token_ids:
        ids = _ids(config.get("eos_token_id"))
        ids += [i for i in stop_token_ids if i not in ids]
        config["eos_token_id"] = ids[0] if len(ids) == 1 else ids
    return config


def write(model_dir: Path, dest: Path, chat: ChatFormat) -> None:
    """Copy the base's tokenizer files from ``model_dir`` into ``dest``, write the chat
    template where ``chat`` says, and the generation config."""
    model_dir, dest = Path(model_dir), Path(dest)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(model_dir / name, dest / name)
    if chat.template is not None:
        if chat.template_file == rendering.TEMPLATE_FILE:
            (dest / rendering.TEMPLATE_FILE).write_text(chat.template)
        else:
            path = dest / rendering.TOKENIZER_CONFIG
            config = json.loads(path.read_text()) if path.is_file() else {}
            config["chat_template"] = chat.template
            path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    config = generation_config(model_dir, chat.stop_token_ids)
    if config is not None:
        (dest / GENERATION_CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
