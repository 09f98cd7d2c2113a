"""The embedded default: deterministic, and loadable by torchtune and by Hugging Face."""

from __future__ import annotations

import hashlib
import json

from kubetune.tools.demo import write_tiny_dataset, write_tiny_model


def _digest(path):
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_generation_is_deterministic(tmp_path, tiny_model_dir, tiny_dataset_dir):
    assert _digest(write_tiny_model(tmp_path / "m")) == _digest(tiny_model_dir)
    assert _digest(write_tiny_dataset(tmp_path / "d")) == _digest(tiny_dataset_dir)


def test_torchtune_and_hugging_face_tokenize_alike(tiny_model_dir):
    from tokenizers import Tokenizer
    from torchtune.models.llama3 import llama3_tokenizer

    ours = llama3_tokenizer(str(tiny_model_dir / "original" / "tokenizer.model"),
                            special_tokens_path=str(tiny_model_dir / "tokenizer.json"))
    hf = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    text = "57+38=95"
    assert ours.encode(text, add_eos=False) == hf.encode(text).ids
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert ours.bos_id == config["bos_token_id"]
    assert max(ours.special_tokens.values()) < config["vocab_size"]


def test_dataset_is_a_learnable_instruct_task(tiny_dataset_dir):
    import pyarrow.parquet as pq

    table = pq.read_table(tiny_dataset_dir / "data" / "train.parquet")
    assert table.column_names == ["input", "output"]
    assert table.num_rows >= 200
    for row in table.slice(0, 20).to_pylist():
        a, b = row["input"].rstrip("=").split("+")
        assert int(a) + int(b) == int(row["output"])
