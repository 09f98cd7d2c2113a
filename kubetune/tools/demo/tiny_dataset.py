"""Small instruct datasets of a learnable task: two-digit addition, as Parquet.

Columns ``input``/``output`` are what torchtune's ``instruct_dataset`` reads by default;
the alpaca shape (``instruction``/``input``/``output``) is what the recipe configs'
default ``alpaca_dataset`` / ``alpaca_cleaned_dataset`` read.
"""

from __future__ import annotations

import random
from pathlib import Path

DEFAULT_ROWS = 512
ALPACA_INSTRUCTION = "Add the two numbers."


def tiny_rows(rows: int = DEFAULT_ROWS, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"input": f"{a}+{b}=", "output": str(a + b)})
    return out


def _write(dataset_dir: Path, name: str, columns: dict[str, list[str]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    dataset_dir = Path(dataset_dir)
    data = dataset_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), data / name)
    return dataset_dir


def write_tiny_dataset(dataset_dir: Path, rows: int = DEFAULT_ROWS, seed: int = 0,
                       columns: tuple[str, str] = ("input", "output")) -> Path:
    """Write ``data/train.parquet`` under ``dataset_dir`` and return ``dataset_dir``.

    ``columns`` names the prompt and answer columns (a dataset that needs a column map).
    """
    records = tiny_rows(rows, seed)
    prompt, answer = columns
    return _write(dataset_dir, "train.parquet", {
        prompt: [r["input"] for r in records], answer: [r["output"] for r in records]})


def write_tiny_alpaca_dataset(dataset_dir: Path, rows: int = DEFAULT_ROWS,
                              seed: int = 0) -> Path:
    """The same task in the alpaca layout a hub repo has (``tatsu-lab/alpaca``:
    ``data/train-00000-of-00001.parquet``, instruction/input/output columns)."""
    records = tiny_rows(rows, seed)
    return _write(dataset_dir, "train-00000-of-00001.parquet", {
        "instruction": [ALPACA_INSTRUCTION] * len(records),
        "input": [r["input"] for r in records], "output": [r["output"] for r in records]})
