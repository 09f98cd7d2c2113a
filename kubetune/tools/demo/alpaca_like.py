"""Instruct rows with Alpaca's length distribution (short instructions, an input on about
40% of rows, long-tailed answers; ~1,150 characters, about 287 Llama-3 tokens, per row),
written as N shards of one format: what speed defaults and benchmarks must handle, made
here instead of downloaded. Seeded: the same call writes the same rows.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

FORMATS = {"parquet": ".parquet", "jsonl": ".jsonl", "json": ".json", "csv": ".csv",
           "arrow": ".arrow"}
_WORDS = ("the a model data train token answer list step value first then each small "
          "large number write explain describe function example because result show "
          "given return input output language people water energy system city").split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, words))).capitalize() + "."


def alpaca_like_rows(rows: int, seed: int = 0, scale: float = 1.0,
                     long_prompts: float = 0.0, long_chars: int = 0) -> list[dict[str, str]]:
    """``scale`` multiplies every length: 0.25 gives a byte-level tokenizer (the tiny
    models') Alpaca's token counts. ``long_prompts``: the share of rows whose prompt (a
    pasted document, say) is made at least ``long_chars`` characters long."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        prompt = _text(rng, int(scale * rng.lognormvariate(2.6, 0.4)))  # ~15 words
        if rng.random() < 0.4:
            prompt += "\n" + _text(rng, int(scale * rng.lognormvariate(2.8, 0.7)))
        answer = _text(rng, int(scale * rng.lognormvariate(4.8, 0.8)))  # ~165, long tail
        if long_prompts and rng.random() < long_prompts:  # (the default's rows stay the same)
            while len(prompt) < long_chars:
                prompt += "\n" + _text(rng, int(rng.lognormvariate(4.8, 0.5)))
        out.append({"input": prompt, "output": answer})
    return out


def write_alpaca_like(dataset_dir: Path, rows: int, shards: int = 1, fmt: str = "parquet",
                      seed: int = 0, scale: float = 1.0, long_prompts: float = 0.0,
                      long_chars: int = 0) -> list[Path]:
    """Write ``data/train-0000i-of-0000n<ext>`` under ``dataset_dir``; return the files."""
    import pyarrow as pa

    data = Path(dataset_dir) / "data"
    data.mkdir(parents=True, exist_ok=True)
    records = alpaca_like_rows(rows, seed, scale, long_prompts, long_chars)
    paths = []
    for i in range(shards):
        part = records[i * rows // shards:(i + 1) * rows // shards]
        path = data / f"train-{i:05d}-of-{shards:05d}{FORMATS[fmt]}"
        table = pa.Table.from_pylist(part, schema=pa.schema([("input", pa.string()),
                                                            ("output", pa.string())]))
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, path)
        elif fmt == "csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(table, path)
        elif fmt == "arrow":  # the IPC stream format `datasets` saves
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink,
                                                                      table.schema) as w:
                w.write_table(table, max_chunksize=1000)
        elif fmt == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in part))
        else:
            path.write_text(json.dumps(part, indent=1))
        paths.append(path)
    return paths
