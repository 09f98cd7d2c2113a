"""The recipe's dataset, tokenized once and cached (``kubetune.trainer.data.token_cache``).

torchtune's recipes build their data in ``_setup_data``: ``config.instantiate(cfg_dataset,
self._tokenizer)`` (once per dataset of a list, then a ``ConcatDataset``), then a sampler
and a loader over it, with the packed collate where the dataset packs. While that method
runs, each such instantiation goes through the cache: the builder runs with
``PackedDataset``'s eager packing deferred, and its result is replaced by the cached rows
or packs before the recipe builds its sampler, so the recipe's own code makes the loader.
The recipe is not changed; the wrap ends when ``_setup_data`` returns. The DPO recipes'
preference pairs go the same way (``CachedPairs``: a pair stored as two rows).

Where a fraction of the training split is held out (``kubetune.holdout``), each dataset
built keeps only its side's rows (``kubetune.trainer.data.held_out_rows``) before it is
tokenized: the training side the rows at or above the fraction, the validation side
(``build_held_out``) the rows below it; the side and fraction are part of the cache key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from kubetune.trainer.data.token_cache.settings import CacheSettings
from kubetune.trainer.performance.cpu_cores import usable_cores
from kubetune.trainer.request import passed_env
from kubetune.trainer.recipe_process import data_counts
from kubetune.trainer.recipe_process.run_sanity import NoTrainableRowsError, RunRefused

# The key the cache key reads the holdout under (never passed to the builder).
HOLDOUT_KEY = "kubetune_holdout"


class NoHeldOutRowsError(RunRefused):
    """The held-out set has no row left to measure on."""


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
        test_kill_at=passed_env.test_kill_token_cache_at(),
        holdout_fraction=_holdout_fraction(settings))


def _holdout_fraction(settings: dict) -> float | None:
    holdout = settings.get("holdout")
    fraction = holdout.get("fraction") if hasattr(holdout, "get") else None
    return None if fraction is None else float(fraction)


def _hold_out(built: Any, fraction: float, side: str) -> None:
    """Keep ``side``'s rows of ``built`` (a builder's dataset, or the PackedDataset
    around one): torchtune's SFTDataset and TextCompletionDataset hold their rows as a
    Hugging Face dataset in ``_data``, and index through it."""
    from torchtune.datasets import PackedDataset

    from kubetune.trainer.data import held_out_rows

    rows = built.ds if isinstance(built, PackedDataset) else built
    data = getattr(rows, "_data", None)
    if data is None or not hasattr(data, "select"):
        raise RunRefused(f"kubetune.holdout: {type(rows).__name__} keeps no rows a held-out "
                         "fraction can be taken from (torchtune's SFTDataset and "
                         "TextCompletionDataset do): hold data out with dataset_val instead")
    rows._data = data.select(held_out_rows.keep_indices(data, fraction, side))


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
def datasets_cached(recipe: Any, settings: CacheSettings, side: str = "train",
                    counts: list | None = None) -> Iterator[list]:
    """torchtune's ``config.instantiate``, for the recipe's datasets, through the cache;
    yields the cached datasets made. ``side``: "train" or "val", the rows each keeps
    where a fraction is held out (``settings.holdout_fraction``); ``counts``: gets each
    dataset's row counts (``data_counts``)."""
    from torchtune import config
    from torchtune.data import CROSS_ENTROPY_IGNORE_IDX
    from torchtune.datasets import PackedDataset

    from kubetune.trainer.data.token_cache import adopt
    from kubetune.trainer.data.token_cache.datasets import CachedPacks, CachedRows

    original = config.instantiate
    made: list = []
    fraction = settings.holdout_fraction
    settings = dataclasses.replace(settings, side=side)

    @functools.wraps(original)
    def instantiate(node, *args, **kwargs):
        tokenizer = getattr(recipe, "_tokenizer", None)
        # SFT recipes pass the tokenizer by position, the DPO recipes as `tokenizer=`.
        given = args[0] if args else kwargs.get("tokenizer")
        if tokenizer is None or given is not tokenizer:
            return original(node, *args, **kwargs)  # not a dataset of this recipe
        with _packing_deferred() as deferred:
            built = original(node, *args, **kwargs)
        ignore_index = getattr(getattr(recipe, "_loss_fn", None), "ignore_index",
                               CROSS_ENTROPY_IGNORE_IDX)
        dataset_cfg = OmegaConf.to_container(node, resolve=True) \
            if isinstance(node, DictConfig) else dict(node)
        before = data_counts.before_hold_out(built)
        if fraction is not None:
            _hold_out(built, fraction, side)
            dataset_cfg[HOLDOUT_KEY] = {"fraction": fraction, "side": side}
        result = adopt.cached(built, deferred, dataset_cfg, tokenizer, ignore_index, settings,
                              pack_now=PackedDataset._pack)
        if counts is not None:
            counts.append(data_counts.counted(built, before, result, side))
        if isinstance(result, (CachedRows, CachedPacks)):
            made.append(result)
        return result

    config.instantiate = instantiate
    try:
        yield made
    finally:
        config.instantiate = original


def build_held_out(recipe: Any, dataset_val_cfg: DictConfig, settings: CacheSettings) -> Any:
    """The held-out dataset (``dataset_val``), built with the recipe's tokenizer through
    the cache, its side of a held-out fraction only: rows of tokens and labels, unpacked.
    No row left (every answer cut by max_seq_len, say): the run is refused, naming it."""
    from torchtune import config

    counts: list = []
    with datasets_cached(recipe, settings, side="val", counts=counts) as made:
        dataset = config.instantiate(dataset_val_cfg, recipe._tokenizer)
    data_counts.report(str(getattr(recipe, "_output_dir", "")), "val", counts)
    if len(dataset) == 0:
        split = dataset_val_cfg.get("split") if hasattr(dataset_val_cfg, "get") else None
        named = f"dataset_val{f' split {split!r}' if split else ''}"
        read = made[0].rows.meta["rows_read"] if made else 0
        why = (f"{read} read, none with a token to measure after tokenization; raise "
               "tokenizer.max_seq_len or give another held-out set") if read else (
            "no row falls in it; hold out a larger fraction or give another held-out set")
        raise NoHeldOutRowsError(f"the held-out set ({named}) has no usable row: {why}")
    return dataset


def wrap_setup_data(original: Callable, settings: CacheSettings) -> Callable:
    """A recipe's ``_setup_data``, its datasets cached; no row left to train on: the run
    is refused (``NoTrainableRowsError``, exit 65)."""

    @functools.wraps(original)
    def setup_data(self, *args, **kwargs):
        counts: list = []
        with datasets_cached(self, settings, counts=counts) as made:
            loader = original(self, *args, **kwargs)
        data_counts.report(str(getattr(self, "_output_dir", "")), "train", counts)
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
