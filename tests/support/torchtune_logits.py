"""Logits of a HF checkpoint as the trainer loads it: the component builder and the
checkpointer the planner picks from config.json, torchtune's weight conversion, fp32."""

from __future__ import annotations

import tempfile
from pathlib import Path


def model(model_dir: Path, **builder_args):
    """The checkpoint's torchtune model in fp32, eval mode; ``builder_args`` beside the
    checkpoint's dimensions (e.g. ``attn_dropout``)."""
    from torchtune.config._utils import _get_component_from_path

    from kubetune.trainer.checkpointing.checkpoint_model import read_checkpoint_model

    checkpoint = read_checkpoint_model(Path(model_dir))
    arch = checkpoint.architecture
    built = _get_component_from_path(arch.component(lora=False))(**arch.dims, **builder_args)
    with tempfile.TemporaryDirectory() as out:
        checkpointer = _get_component_from_path(arch.checkpointer)(
            checkpoint_dir=str(model_dir), checkpoint_files=checkpoint.weight_files,
            model_type=arch.model_type, output_dir=out)
        state = checkpointer.load_checkpoint()["model"]
    built.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return built.eval()


def logits(model_dir: Path, tokens: list[list[int]]):
    import torch

    with torch.no_grad():
        return model(model_dir)(torch.tensor(tokens)).float()
