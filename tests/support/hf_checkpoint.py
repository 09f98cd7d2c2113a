"""Run inside the serving venv (transformers, no kubetune): write a tiny checkpoint of a
model family with transformers itself, or print a checkpoint's logits on given tokens.

Usage:
  python hf_checkpoint.py write FAMILY DIR VOCAB_SIZE [SHAPE]   (random weights, seeded;
                                                                 fp32; SHAPE small or nf4)
  python hf_checkpoint.py write-many SPECS.json   ([[FAMILY, DIR, VOCAB_SIZE, SHAPE], ...]:
                                                   one process for many checkpoints)
  python hf_checkpoint.py logits DIR TOKENS.json        (prints the logits as JSON)
  python hf_checkpoint.py logits-many SPECS.json   ({"tokens": ..., "dirs": [...]}: prints
                                                    {dir: logits} as JSON)
  python hf_checkpoint.py peft-logits-many SPECS.json  ({"tokens": ...,
                                                    "adapters": [[ADAPTER_DIR, BASE_DIR], ...]}:
                                                    each PEFT adapter applied to its base;
                                                    prints {adapter dir: logits})
"""

import json
import sys
from pathlib import Path

import torch
import transformers

# The families' config fields and the shapes, in a module the suite imports without
# transformers (tests/test_config_families.py checks every family row has one).
from hf_families import FAMILIES, SHAPES  # noqa: E402  (this script's own folder)


def config_fields(family: str, shape: str) -> dict:
    fields = dict(FAMILIES[family][2])
    fields.update(fields.pop("nf4", {}) if shape == "nf4" else {})  # a shape's own values
    fields.pop("nf4", None)
    sizes = dict(SHAPES[shape])
    factor = fields.pop("head_dim_factor", None)
    if factor:
        fields["head_dim"] = int(factor * sizes["hidden_size"] / sizes["num_attention_heads"])
        if family.startswith("gemma2"):
            fields["query_pre_attn_scalar"] = fields["head_dim"]
    if "kv_heads" in fields:
        sizes["num_key_value_heads"] = fields.pop("kv_heads")
    return {**sizes, **fields}


def write(family: str, out: Path, vocab_size: int, shape: str = "small") -> None:
    config_cls, model_cls, _ = FAMILIES[family]
    config = getattr(transformers, config_cls)(vocab_size=vocab_size,
                                               **config_fields(family, shape))
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.float32)
    with torch.no_grad():  # norms start at 1 (0 for Gemma's 1+w): make them count
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(out, safe_serialization=True)


def model_logits(model_dir: Path, tokens: list) -> list:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.tolist()


def peft_logits(adapter_dir: Path, base_dir: Path, tokens: list) -> list:
    from peft import PeftModel  # only here: the other modes need no peft

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.tolist()


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "write":
        write(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6])
    elif command == "write-many":
        for family, out, vocab, shape in json.loads(Path(sys.argv[2]).read_text()):
            write(family, Path(out), int(vocab), shape)
    elif command == "logits":
        print(json.dumps(model_logits(Path(sys.argv[2]),
                                      json.loads(Path(sys.argv[3]).read_text()))))
    elif command == "peft-logits-many":
        specs = json.loads(Path(sys.argv[2]).read_text())
        print(json.dumps({d: peft_logits(Path(d), Path(base), specs["tokens"])
                          for d, base in specs["adapters"]}))
    else:
        specs = json.loads(Path(sys.argv[2]).read_text())
        print(json.dumps({d: model_logits(Path(d), specs["tokens"]) for d in specs["dirs"]}))
