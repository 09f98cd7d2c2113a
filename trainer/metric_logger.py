"""A torchtune metric logger (chosen by config) that writes JSON lines a program reads
and prints progress lines ``kubectl logs`` shows without carriage-return bars."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Mapping

METRICS_NAME = "metrics.jsonl"


def _scalar(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    return value


class JsonLinesMetricLogger:
    """Implements torchtune's MetricLoggerInterface (log, log_dict, log_config, close)."""

    def __init__(self, log_dir: str, print_every_s: float = 5.0, **_: Any) -> None:
        self._path = Path(log_dir) / METRICS_NAME
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self._path, "a", encoding="utf-8")
        self._start = time.monotonic()
        self._print_every_s = print_every_s
        self._last_print = float("-inf")

    def log(self, name: str, data: Any, step: int) -> None:
        self.log_dict({name: data}, step)

    def log_dict(self, payload: Mapping[str, Any], step: int) -> None:
        record = {"step": int(step), "time_s": round(time.monotonic() - self._start, 3)}
        for key, value in payload.items():
            key = "tokens_per_second" if key == "tokens_per_second_per_gpu" else key
            record[key] = _scalar(value)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        now = time.monotonic()
        if now - self._last_print >= self._print_every_s or step == 1:
            self._last_print = now
            parts = [f"step {record['step']}"]
            if "loss" in record:
                parts.append(f"loss {record['loss']:.4f}")
            if "lr" in record:
                parts.append(f"lr {record['lr']:.2e}")
            if "tokens_per_second" in record:
                parts.append(f"{record['tokens_per_second']:.0f} tok/s")
            print("train: " + " | ".join(parts), file=sys.stdout, flush=True)

    def log_config(self, config: Any) -> None:
        pass  # the launcher already wrote the merged config next to the metrics

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __del__(self) -> None:
        self.close()


def read_metrics(output_dir: Path) -> list[dict]:
    path = Path(output_dir) / METRICS_NAME
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
