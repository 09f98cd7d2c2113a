"""The recipe's dataset, tokenized once and cached (``kubetune.trainer.data.token_cache``).

torchtune's recipes build their data in ``_setup_data``: ``config.instantiate(cfg_dataset,
self._tokenizer)`` (once per dataset of a list, then a ``ConcatDataset``), then a sampler
and a loader over it, with the packed collate where the dataset packs. While that method
runs, each such instantiation goes through the cache: the builder runs with
``PackedDataset``'s eager packing deferred, and its result is replaced by the cached rows
or packs before the recipe builds its sampler, so the recipe's own code makes the loader.
The recipe is not changed; the wrap ends when ``_setup_data`` returns.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from kubetune.trainer.data.token_cache.settings import CacheSettings
from kubetune.trainer.performance.cpu_cores import usable_cores
from kubetune.trainer.request import passed_env
from kubetune.trainer.recipe_process.run_sanity import NoTrainableRowsError


def cache_settings(cfg: DictConfig, settings: dict) -> CacheSettings:
    """From the merged config (its ``kubetune`` section: ``settings``)."""
    root = settings.get("token_cache_dir")
    tokenizer = cfg.get("tokenizer")
    return CacheSettings(
        root=Path(root) if root else None,
        tokenizer_cfg=OmegaConf.to_container(tokenizer, resolve=True)
        if isinstance(tokenizer, DictConfig) else {},
        report_cuts=bool(settings.get("count_cut_samples")), primary=passed_env.is_primary(),
        cores=usable_cores(), local_processes=passed_env.local_world_size(),
        test_kill_at=passed_env.test_kill_token_cache_at())


@contextlib.contextmanager
def _packing_deferred() -> Iterator[list]:
    """PackedDatasets made meanwhile keep their rows unpacked (listed in the yielded list)."""
    from torchtune.datasets import PackedDataset

    made: list = []
    original = PackedDataset._pack
    PackedDataset._pack = lambda self: made.append(self)
    try:
        yield made
    finally:
        PackedDataset._pack = original


@contextlib.contextmanager
def _datasets_cached(recipe: Any, settings: CacheSettings) -> Iterator[list]:
    """torchtune's ``config.instantiate``, for the recipe's datasets, through the cache;
    yields the cached datasets made."""
    from torchtune import config
    from torchtune.data import CROSS_ENTROPY_IGNORE_IDX
    from torchtune.datasets import PackedDataset

    from kubetune.trainer.data.token_cache import adopt
    from kubetune.trainer.data.token_cache.datasets import CachedPacks, CachedRows

    original = config.instantiate
    made: list = []

    @functools.wraps(original)
    def instantiate(node, *args, **kwargs):
        tokenizer = getattr(recipe, "_tokenizer", None)
        if not args or tokenizer is None or args[0] is not tokenizer:
            return original(node, *args, **kwargs)  # not a dataset of this recipe
        with _packing_deferred() as deferred:
            built = original(node, *args, **kwargs)
        ignore_index = getattr(getattr(recipe, "_loss_fn", None), "ignore_index",
                               CROSS_ENTROPY_IGNORE_IDX)
        dataset_cfg = OmegaConf.to_container(node, resolve=True) \
            if isinstance(node, DictConfig) else dict(node)
        result = adopt.cached(built, deferred, dataset_cfg, tokenizer, ignore_index, settings,
                              pack_now=PackedDataset._pack)
        if isinstance(result, (CachedRows, CachedPacks)):
            made.append(result)
        return result

    config.instantiate = instantiate
    try:
        yield made
    finally:
        config.instantiate = original


def wrap_setup_data(original: Callable, settings: CacheSettings) -> Callable:
    """A recipe's ``_setup_data``, its datasets cached; no row left to train on: the run
    is refused (``NoTrainableRowsError``, exit 65)."""

    @functools.wraps(original)
    def setup_data(self, *args, **kwargs):
        with _datasets_cached(self, settings) as made:
            loader = original(self, *args, **kwargs)
        metas = [dataset.rows.meta for dataset in made]
        if metas and not any(meta["rows"] for meta in metas) \
                and len(getattr(loader, "dataset", ())) == 0:
            from kubetune.trainer.data.token_cache.dropped import nothing_left_line

            by_reason: dict[str, dict] = {}
            for meta in metas:  # reasons of every dataset of a list, counted together
                for reason, entry in (meta.get("dropped_by") or {}).items():
                    have = by_reason.setdefault(reason, {"count": 0, "rows": []})
                    have["count"] += entry["count"]
                    have["rows"] = have["rows"] or entry["rows"]
            raise NoTrainableRowsError(nothing_left_line(
                sum(meta["rows_read"] for meta in metas), metas[0]["max_seq_len"], by_reason))
        return loader

    return setup_data
