"""A dataset the recipe's builder made, swapped for the same rows read from the cache.

The builder runs as torchtune wrote it, except that a ``PackedDataset`` it creates does not
pack yet (the recipe process defers ``_pack``): its rows dataset and its packing
parameters, exactly as that builder chose them, are what is cached. A map-style dataset
whose rows are tokens and labels is cached as rows; anything else (an iterable dataset,
rows of other keys) is left as built, and packed by torchtune if it asked to be.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import Any, Callable

from torchtune.datasets import PackedDataset

from kubetune.trainer.data import truncation
from kubetune.trainer.data.chat_messages import RowDropped
from kubetune.trainer.data.token_cache import build, dropped, store
from kubetune.trainer.data.token_cache.datasets import CachedPacks, CachedPairs, CachedRows
from kubetune.trainer.data.token_cache.key import cache_key
from kubetune.trainer.data.token_cache.packs import pack_bounds
from kubetune.trainer.data.token_cache.rows import FORMAT_VERSION, TokenRows
from kubetune.trainer.data.token_cache.settings import CacheSettings

log = logging.getLogger("trainer")


def _packing(packed: PackedDataset) -> dict:
    return {"max_seq_len": int(packed.max_seq_len), "padding_idx": int(packed.padding_idx),
            "max_packs": packed.max_packs, "split_across_pack": bool(packed.split_across_pack)}


def _not_cacheable(dataset: Any) -> str | None:
    """Why ``dataset`` is not cached, from its type and first row; None: it is."""
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        return f"{type(dataset).__name__} is not a map-style dataset"
    if len(dataset) == 0:
        return "it has no rows"
    for index in range(min(len(dataset), _ROWS_TRIED)):
        try:
            sample = dataset[index]
        except Exception as exc:  # a row its transform fails on: dropped when built
            if dropped.reason_of(exc, RowDropped) is None:
                raise
            continue
        try:
            build._row_keys(sample, index)
        except build.NotCacheable as exc:
            return str(exc)
        return None
    return None


# Rows tried for the first one its transform makes a sample of (the others are dropped).
_ROWS_TRIED = 64


def _produce(dataset: Any, tokenizer: Any, ignore_index: int, packing: dict | None,
             settings: CacheSettings, key: str, inputs: dict) -> store.Produce:
    def produce(writer, shared: bool) -> None:
        # Building the shared entry, this node's other processes wait: all cores are ours.
        cores = settings.cores if shared else max(1, settings.cores // settings.local_processes)
        workers = build.workers_for(len(dataset), cores)
        started = time.monotonic()
        counts = build.tokenize(dataset, tokenizer, ignore_index, workers, writer.write,
                                after_range=lambda done: store.kill_point("tokenizing", settings.test_kill_at))
        offsets = counts.offsets()
        pairs = build.is_pairs(counts.keys)
        samples = counts.kept // 2 if pairs else counts.kept
        packs = pack_bounds(offsets, packing["max_seq_len"], packing["split_across_pack"],
                            packing["max_packs"]) if packing else None
        meta = {"format": FORMAT_VERSION, "key": key, "rows": counts.kept,
                "rows_read": counts.read, "dropped": counts.read - samples,
                "pairs": samples if pairs else None,
                "dropped_by": counts.drops.meta(),
                "tokens": int(offsets[-1]), "cut": counts.cut, "cut_seen": counts.seen,
                "max_seq_len": getattr(tokenizer, "max_seq_len", None),
                "row_keys": counts.keys, "packing": packing,
                "packs": None if packs is None else len(packs) - 1,
                "built_by": f"pid {os.getpid()} on {socket.gethostname()}",
                "build_s": round(time.monotonic() - started, 3),
                "build_workers": max(1, workers), "inputs": inputs}
        writer.finish(offsets, packs, meta)

    return produce


def _held_out(settings: CacheSettings) -> str:
    return "held-out " if settings.side == "val" else ""


def _report(rows: TokenRows, built: bool, settings: CacheSettings) -> None:
    meta = rows.meta
    where = rows.where or "memory"
    pairs = meta.get("pairs")
    what = f"{_held_out(settings)}{'preference pairs' if pairs is not None else 'rows'}"
    kept = meta["rows"] if pairs is None else pairs
    if built:
        # Every process that builds says so (the others map what one built).
        log.info("token cache: tokenized %d %s (%d kept) in %.1f s with %d process(es) "
                 "into %s", meta["rows_read"], what, kept, meta["build_s"],
                 meta["build_workers"], where)
    elif settings.primary:
        log.info("token cache: %d %s mapped from %s (built by %s)", kept, what, where,
                 meta.get("built_by", "?"))
    if not settings.primary:
        return
    # The cut line speaks of the training rows (what max_seq_len costs the run).
    if settings.report_cuts and meta.get("cut") and settings.side == "train":
        print(truncation.report(meta["cut"], meta["cut_seen"], meta["max_seq_len"]),
              file=sys.stdout, flush=True)
    if meta["dropped"]:
        log.warning(dropped.dropped_line(meta["dropped"], meta["rows_read"],
                                         meta["max_seq_len"], meta.get("dropped_by"),
                                         settings.side))


def cached(built: Any, deferred: list[PackedDataset], dataset_cfg: dict, tokenizer: Any,
           ignore_index: int, settings: CacheSettings,
           pack_now: Callable[[PackedDataset], None]) -> Any:
    """What the recipe trains on instead of ``built`` (the builder's result, its
    ``deferred`` PackedDatasets not packed yet; ``pack_now`` packs one as torchtune does)."""
    target = built if isinstance(built, PackedDataset) and built in deferred else None
    rows_dataset = target.ds if target is not None else built
    packing = _packing(target) if target is not None else None
    if len(deferred) > (target is not None):
        reason = "its builder packs inside another dataset"
    else:
        reason = _not_cacheable(rows_dataset)
    if reason is None:
        key, inputs = cache_key(dataset_cfg, settings.tokenizer_cfg, packing, ignore_index)
        try:
            rows, built_now = store.obtain(
                settings.root, key,
                _produce(rows_dataset, tokenizer, ignore_index, packing, settings, key, inputs),
                warn=log.warning if settings.primary else log.debug,
                kill_at=settings.test_kill_at)
        except build.NotCacheable as exc:
            reason = str(exc)
    if reason is not None:
        log.debug("token cache: %s is used as built (%s)", type(built).__name__, reason)
        for packed in deferred:
            pack_now(packed)
        return built
    _report(rows, built_now, settings)
    if build.is_pairs(rows.meta.get("row_keys", [])):
        return CachedPairs(rows, tokenized_from=rows_dataset)
    if packing is None:
        return CachedRows(rows, tokenized_from=rows_dataset)
    return CachedPacks(rows, **packing, tokenized_from=rows_dataset)
