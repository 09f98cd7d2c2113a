"""Run under torchrun (gloo, CPU): answers on held-out prompts made by every rank together.

Usage: torchrun --nproc_per_node 2 answers_ranks.py MODEL_DIR ROWS_JSON OUT_DIR PROMPTS NEW

Each rank writes OUT_DIR/rank<r>.json: {"sharded": the answers of the model sharded with
torchtune's FSDP2 (``training.shard_model``) as the distributed recipes shard it,
"diverging": the answers of an unsharded model whose weights differ on every rank and whose
forwards all-reduce (FSDP's collectives stand-in): ranks that chose their own tokens would
answer differently, or stop at different steps and hang}.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist


def main(model_dir: Path, rows_json: Path, out_dir: Path, prompts: int, new: int) -> None:
    from torchtune import training
    from torchtune.datasets import chat_dataset
    from torchtune.models.llama3 import llama3_tokenizer
    from torchtune.modules import TransformerSelfAttentionLayer

    from kubetune.trainer.validation import answers
    from tests.support.torchtune_logits import model as load

    torch.set_num_threads(1)
    # A rank that ran other forwards than the others fails in a minute, not half an hour.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    tokenizer = llama3_tokenizer(path=str(model_dir / "original" / "tokenizer.model"),
                                 special_tokens_path=str(model_dir / "tokenizer.json"),
                                 max_seq_len=512)
    rows = chat_dataset(tokenizer, source="json", data_files=str(rows_json), split="train",
                        conversation_column="messages", conversation_style="openai")

    def recipe(model):
        return SimpleNamespace(_model=model, _tokenizer=tokenizer, _device=torch.device("cpu"))

    sharded = load(model_dir)
    training.shard_model(sharded, [lambda _n, m: isinstance(m, TransformerSelfAttentionLayer)],
                         cpu_offload=False, reshard_after_forward=True)
    found = {"sharded": answers.answer(recipe(sharded), rows, prompts, new)}

    diverging = load(model_dir)
    with torch.no_grad():
        diverging.output.weight.mul_(1.0 + rank)
        diverging.output.weight.add_(torch.randn_like(diverging.output.weight), alpha=rank)
    diverging.register_forward_pre_hook(lambda _m, _a: dist.all_reduce(torch.ones(1)))
    found["diverging"] = answers.answer(recipe(diverging), rows, prompts, new)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]),
         int(sys.argv[5]))
