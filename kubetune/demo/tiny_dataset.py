"""A small instruct dataset of a learnable task: two-digit addition, as Parquet.

Columns ``input``/``output`` are what torchtune's ``instruct_dataset`` reads by default.
"""

from __future__ import annotations

import random
from pathlib import Path

DEFAULT_ROWS = 512


def tiny_rows(rows: int = DEFAULT_ROWS, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"input": f"{a}+{b}=", "output": str(a + b)})
    return out


def write_tiny_dataset(dataset_dir: Path, rows: int = DEFAULT_ROWS, seed: int = 0) -> Path:
    """Write ``data/train.parquet`` under ``dataset_dir`` and return ``dataset_dir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dataset_dir = Path(dataset_dir)
    data = dataset_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    records = tiny_rows(rows, seed)
    table = pa.table({
        "input": [r["input"] for r in records],
        "output": [r["output"] for r in records],
    })
    pq.write_table(table, data / "train.parquet")
    return dataset_dir
