"""The embedded default: a tiny model and dataset generated locally, so the demo and the
tests never reach a hub. Generation is seeded, so the same call writes the same bytes."""

from kubetune.tools.demo.tiny_dataset import write_tiny_alpaca_dataset, write_tiny_dataset
from kubetune.tools.demo.tiny_model import TinyModelSpec, write_tiny_model
from kubetune.tools.demo.tiny_qwen2 import TinyQwen2Spec, write_tiny_qwen2

__all__ = ["TinyModelSpec", "TinyQwen2Spec", "write_tiny_alpaca_dataset", "write_tiny_dataset",
           "write_tiny_model", "write_tiny_qwen2"]
