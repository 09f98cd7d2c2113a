"""The models bench/gpu.py's cases train, by name: random weights in the shapes the
targets are stated for on a GPU, the tiny Llama-3 family on CPU (``--cpu-smoke``).

Loaded by path from bench/gpu.py (bench/ is no package); the shapes are the other
benches' own (bench/trainer.py's, bench/distill.py's teacher), not copies.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# name -> (GPU shape: module attribute, CPU stand-in). On a GPU the QLoRA case trains
# the 1B model itself (NF4's blocks divide its projections); on CPU the 8B case the tiny
# one (its configs and recipes are what the smoke checks).
_GPU = {"1B": ("trainer", "LLAMA_3_2_1B"), "1B-nf4": ("trainer", "LLAMA_3_2_1B"),
        "8B": ("trainer", "LLAMA_3_1_8B"), "3B": ("distill", "LLAMA_3_2_3B")}
_CPU = {"1B": "tiny", "1B-nf4": "tiny-nf4", "8B": "tiny", "3B": "tiny-teacher"}


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_key(name: str, smoke: bool) -> str:
    """The folder a model is written to: names that are one model share it."""
    if smoke:
        return _CPU[name]
    return "1B" if _GPU[name] == _GPU["1B"] else name


def spec_of(name: str, device: str):
    from kubetune.tools.demo import TinyModelSpec

    if device != "cpu":
        module, attribute = _GPU[name]
        return getattr(_bench(module), attribute)
    # Positions for 2048-token packs (plain torchtune does not truncate).
    return {"tiny": TinyModelSpec(max_position_embeddings=8192),
            "tiny-nf4": _bench("trainer").TINY_NF4,
            "tiny-teacher": TinyModelSpec(num_hidden_layers=4, seed=7,
                                          max_position_embeddings=8192)}[_CPU[name]]


def write_model(name: str, model_dir: Path, device: str) -> Path:
    """Write model ``name`` to ``model_dir``, its weights drawn on ``device``."""
    from kubetune.tools.demo import write_tiny_model

    return write_tiny_model(model_dir, spec_of(name, device), device=device)
