"""The recipe's data setup, in this process: torchtune's own ``_setup_data`` of its LoRA
recipe, wrapped as the bootstrap wraps it (``tokenized_data``), called on a stand-in for the
recipe object (its tokenizer and loss, what ``_setup_data`` reads). The data path of a
training run in seconds, without a model."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

from kubetune.trainer.data.token_cache.settings import CacheSettings
from kubetune.trainer.performance.cpu_cores import usable_cores
from kubetune.trainer.recipe_process import sample_capture, tokenized_data
from kubetune.trainer.request import passed_env
from kubetune.trainer.recipe_process.bootstrap import load_recipe_module, recipe_class

RECIPE = "lora_finetune_single_device"


def recipe_cls() -> type:
    from kubetune.trainer.config.recipe_config import resolve_recipe

    return recipe_class(load_recipe_module(resolve_recipe(RECIPE)[0]))


def tokenizer_cfg(model_dir: Path, max_seq_len: int | None) -> dict:
    """The tiny Llama-3's tokenizer section, as the launcher writes it."""
    return {"_component_": "torchtune.models.llama3.llama3_tokenizer",
            "path": str(model_dir / "original" / "tokenizer.model"),
            "special_tokens_path": str(model_dir / "tokenizer.json"),
            "max_seq_len": max_seq_len}


def instruct(data_dir: Path, **extra: Any) -> dict:
    return {"_component_": "torchtune.datasets.instruct_dataset", "source": "parquet",
            "data_files": sorted(str(p) for p in Path(data_dir).rglob("*.parquet")),
            "split": "train", **extra}


def setup_data(cache_root: Path | None | bool, model_dir: Path, dataset: dict | list,
               max_seq_len: int | None = 512, batch_size: int = 4, cls: type | None = None,
               report_cuts: bool = True, samples_dir: Path | None = None) -> Any:
    """The recipe's loader over ``dataset`` (a dataset section, or a list of them), its data
    cached under ``cache_root`` (None: in memory; False: not cached, torchtune's own);
    ``samples_dir``: also record the training samples there, as the bootstrap does
    (``sample_capture`` around the cache, fingerprint "test")."""
    from torchtune import config
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    tok_cfg = tokenizer_cfg(model_dir, max_seq_len)
    settings = CacheSettings(root=cache_root, tokenizer_cfg=tok_cfg, report_cuts=report_cuts,
                             primary=True, cores=usable_cores(), local_processes=1,
                             test_kill_at=passed_env.test_kill_token_cache_at())
    setup = (cls or recipe_cls())._setup_data
    if cache_root is not False:  # False: torchtune's own setup, for comparison
        setup = tokenized_data.wrap_setup_data(setup, settings)
    if samples_dir is not None:
        setup = sample_capture.wrap_setup_data(setup, str(samples_dir), "test")
    recipe = SimpleNamespace(_tokenizer=config.instantiate(OmegaConf.create(tok_cfg)),
                             _loss_fn=CEWithChunkedOutputLoss())
    # (The recipe takes the packed collate itself where the dataset packs.)
    return setup(recipe, cfg_dataset=OmegaConf.create(dataset), shuffle=False,
                 batch_size=batch_size, collate_fn="torchtune.data.padded_collate_sft")


def entries(cache_root: Path) -> list[Path]:
    """The complete entries under ``cache_root`` (not a builder's staging directory)."""
    return sorted(p.parent for p in Path(cache_root).glob("*/meta.json")
                  if not p.parent.name.startswith("."))

