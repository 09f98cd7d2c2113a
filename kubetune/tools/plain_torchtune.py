"""Plain torchtune, the baseline the benches and tests compare against: the overrides its
own `tune run` needs to load one of our checkpoints, as a user would write them."""

from __future__ import annotations

from pathlib import Path


def loading_overrides(model_dir: Path, lora: bool = True) -> list[str]:
    """The architecture's builder and dims, the weight files, the model type and the
    special tokens of the checkpoint in ``model_dir`` (upstream reads none of them from
    config.json)."""
    from kubetune.trainer.checkpointing.checkpoint_model import read_checkpoint_model

    ckpt = read_checkpoint_model(model_dir)
    return [f"model._component_={ckpt.architecture.component(lora=lora)}",
            *[f"model.{k}={v}" for k, v in ckpt.architecture.dims.items()],
            f"checkpointer.checkpoint_files=[{','.join(ckpt.weight_files)}]",
            f"checkpointer.model_type={ckpt.architecture.model_type}",
            f"tokenizer.special_tokens_path={model_dir / 'tokenizer.json'}"]
