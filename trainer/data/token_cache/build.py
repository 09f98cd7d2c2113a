"""Tokenize every row once, in parallel: a pool of worker processes, forked from the recipe
process so each inherits the dataset (its Arrow table, mapped) and the tokenizer as they
are, each tokenizing a range of rows exactly as training would (``dataset[i]``: torchtune's
message transform and tokenizer, truncation included) and handing back flat arrays. The
parent writes the ranges in order (``writer``), so the result is the rows in the dataset's
order, whatever order the workers finish in.

Two counts ride along, so no later pass reads the rows again: the rows the tokenizer cut
to ``max_seq_len`` (``truncation.CutCounter``, in each worker), and the rows dropped, by
reason with their first row numbers (``dropped``): those no trainable token is left in
(the recipes shift labels left by one, so a row counts as trainable only if a label after
its first is not the loss's ignore index), and those the dataset's transform cannot make
a sample of (the chat builder's ``RowDropped``, torchtune's errors on one row).
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
from torchtune.data import CROSS_ENTROPY_IGNORE_IDX  # the labels of masked tokens

from kubetune.parent_death import die_with_parent
from kubetune.trainer.data.chat_messages import RowDropped
from kubetune.trainer.data.token_cache.dropped import NO_TOKEN, Drops, reason_of
from kubetune.trainer.data.truncation import CutCounter

ROW_KEYS = {"tokens", "labels"}
# SFTDataset's rows also carry their "mask", which is exactly their labels == -100.
OPTIONAL_KEYS = {"mask"}
# torchtune's PreferenceDataset's rows (DPO): a pair, stored as two rows, chosen then
# rejected. Every pair is kept, as the recipe trains on it uncached (one with no label left
# adds ln 2 and no gradient); the builder drops the pairs DPO cannot learn from.
PAIR_SIDES = ("chosen", "rejected")
PAIR_KEYS = {f"{side}_{part}" for side in PAIR_SIDES for part in ("input_ids", "labels")}
ROWS_PER_WORKER_MIN = 1024  # below this a forked worker costs more than it saves
RANGE_ROWS_MAX = 2048
_INT32 = np.iinfo(np.int32)


class NotCacheable(Exception):
    """The dataset's rows are not token/label lists this cache can reproduce exactly."""


@dataclass
class BuildCounts:
    read: int = 0  # rows tokenized
    cut: int = 0  # of those, cut to the tokenizer's max_seq_len (when it tokenizes messages)
    seen: int = 0  # rows the cut counter saw (0: the tokenizer's messages path is not used)
    keys: list[str] = field(default_factory=list)  # what each row holds, as the dataset gave it
    lengths: list[np.ndarray] = field(default_factory=list)  # kept rows' lengths, per range
    drops: Drops = field(default_factory=Drops)

    @property
    def kept(self) -> int:
        return int(sum(len(part) for part in self.lengths))

    def offsets(self) -> np.ndarray:
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


@dataclass
class _Range:
    tokens: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray
    read: int
    cut: int
    seen: int
    keys: list[str]
    drops: Drops


# What a forked worker tokenizes: set in the parent just before the pool forks.
_JOB: tuple[Any, Any, int] | None = None


def _worker_started() -> None:
    die_with_parent()  # a killed recipe process leaves no worker tokenizing on
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles a stop
    # Not the recipe process's handler (the step guard's: "stop at the next step"), which
    # would leave a worker deaf to the pool's own SIGTERM.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def is_pairs(keys: list[str]) -> bool:
    """Whether rows of ``keys`` (an entry's ``row_keys``) are preference pairs."""
    return set(keys) == PAIR_KEYS


def _row_keys(sample: Any, index: int) -> list[str]:
    keys = set(sample) if isinstance(sample, dict) else set()
    if keys == PAIR_KEYS:
        for side in PAIR_SIDES:
            if len(sample[f"{side}_input_ids"]) != len(sample[f"{side}_labels"]):
                raise NotCacheable(f"row {index}: {side} ids and labels differ in length")
        return sorted(keys)
    if not ROW_KEYS <= keys or keys - ROW_KEYS - OPTIONAL_KEYS:
        raise NotCacheable(f"row {index} holds {sorted(keys) or type(sample).__name__}, not "
                           "tokens and labels")
    if len(sample["tokens"]) != len(sample["labels"]):
        raise NotCacheable(f"row {index}: tokens and labels differ in length")
    return sorted(keys)


def _tokenize_range(span: tuple[int, int]) -> _Range:
    start, stop = span
    dataset, tokenizer, ignore_index = _JOB
    counter = CutCounter(tokenizer) if _counts_cuts(tokenizer) else None
    # Each row as arrays at once: a range's rows as Python ints would take ~10x the memory.
    tokens: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    keys = None
    drops, failed = Drops(), set()
    try:
        for index in range(start, stop):
            try:
                sample = dataset[index]
            except Exception as exc:  # the transform's, on this row: left out, counted
                reason = reason_of(exc, RowDropped)
                if reason is None:
                    raise
                drops.add(reason, index)
                failed.add(index - start)
                tokens.append(np.zeros(0, np.int64))  # no tokens: never kept
                labels.append(np.zeros(0, np.int64))
                continue
            row_keys = _row_keys(sample, index)
            if keys is None:
                keys = row_keys
            elif row_keys != keys:
                raise NotCacheable(f"row {index} holds {row_keys}, row {start} {keys}")
            if is_pairs(row_keys):
                for side in PAIR_SIDES:
                    tokens.append(np.asarray(sample[f"{side}_input_ids"], dtype=np.int64))
                    labels.append(np.asarray(sample[f"{side}_labels"], dtype=np.int64))
                continue
            tokens.append(np.asarray(sample["tokens"], dtype=np.int64))
            labels.append(np.asarray(sample["labels"], dtype=np.int64))
            if "mask" in sample:
                masks.append(np.asarray(sample["mask"], dtype=bool))
    finally:
        if counter is not None:
            counter.remove()
    length_array = np.asarray([len(row) for row in tokens], dtype=np.int64)
    token_array, label_array = (np.concatenate(rows) if rows else np.zeros(0, np.int64)
                                for rows in (tokens, labels))
    for name, values in (("tokens", token_array), ("labels", label_array)):
        if values.size and (values.min() < _INT32.min or values.max() > _INT32.max):
            raise NotCacheable(f"{name} outside 32-bit integers")
    if masks and not np.array_equal(np.concatenate(masks), label_array == CROSS_ENTROPY_IGNORE_IDX):
        raise NotCacheable("a row's mask is not where its labels are ignored")
    if keys is not None and is_pairs(keys):
        if failed:  # two rows a pair, one a failed row: the pairs would not line up
            raise NotCacheable(f"preference row {start + min(failed)} failed its transform")
        keep = np.ones(len(length_array), dtype=bool)
    else:
        keep = _trainable(label_array, length_array, ignore_index)
    for offset in np.flatnonzero(~keep):
        if int(offset) not in failed:
            drops.add(NO_TOKEN, start + int(offset))
    token_keep = np.repeat(keep, length_array)
    return _Range(tokens=token_array[token_keep].astype(np.int32),
                  labels=label_array[token_keep].astype(np.int32),
                  lengths=length_array[keep], read=stop - start,
                  cut=counter.cut if counter else 0, seen=counter.seen if counter else 0,
                  keys=keys or [], drops=drops)


def _counts_cuts(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "max_seq_len", None)) and hasattr(tokenizer,
                                                                     "tokenize_messages")


def _trainable(labels: np.ndarray, lengths: np.ndarray, ignore_index: int) -> np.ndarray:
    """Per row: whether any label after its first is trained on (the recipe shifts the
    labels left by one, so the first one never is)."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    trained = labels != ignore_index
    trained[starts[lengths > 0]] = False
    running = np.concatenate([[0], np.cumsum(trained, dtype=np.int64)])
    return (running[ends] - running[starts]) > 0


def _spans(rows: int, workers: int) -> list[tuple[int, int]]:
    # Several ranges per worker, so one slow range does not leave the others idle at the end;
    # small enough that a range's arrays in flight stay a few MB.
    size = max(256, min(RANGE_ROWS_MAX, -(-rows // max(1, workers * 8))))
    return [(start, min(rows, start + size)) for start in range(0, rows, size)]


def workers_for(rows: int, cores: int) -> int:
    """Worker processes for ``rows`` rows on ``cores`` cores; 0: tokenize in this process."""
    workers = min(cores, rows // ROWS_PER_WORKER_MIN)
    return workers if workers >= 2 else 0


class WorkerDied(RuntimeError):
    """A tokenizing worker was killed (by the kernel's OOM killer, most likely)."""


def _ranges(rows: int, workers: int) -> Iterator[_Range]:
    """Each range tokenized, in order. With workers, a few ranges per worker are in flight
    at a time, so results waiting to be written stay a few ranges' worth."""
    spans = iter(_spans(rows, workers))
    if workers == 0:
        for span in spans:
            yield _tokenize_range(span)
        return
    # concurrent.futures, not multiprocessing.Pool: a worker that dies makes the pool
    # raise (BrokenProcessPool) instead of waiting for its result forever. Workers are
    # forked from this thread, up front (the kernel kills them when it ends).
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=_worker_started)
    try:
        pending = collections.deque(pool.submit(_tokenize_range, span)
                                    for span in itertools.islice(spans, 2 * workers))
        while pending:
            try:
                done = pending.popleft().result()
            except BrokenProcessPool as exc:
                raise WorkerDied("a process tokenizing the dataset was killed (out of memory? "
                                 "raise the container's memory limit)") from exc
            pending.extend(pool.submit(_tokenize_range, span)
                           for span in itertools.islice(spans, 1))
            yield done
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def tokenize(dataset: Any, tokenizer: Any, ignore_index: int, workers: int,
             write: Callable[[np.ndarray, np.ndarray], None],
             after_range: Callable[[int], None] = lambda done: None) -> BuildCounts:
    """Tokenize every row of ``dataset``; ``write(tokens, labels)`` gets the kept rows'
    arrays range by range, in order. ``after_range(ranges_done)``: test hooks."""
    global _JOB
    counts = BuildCounts()
    _JOB = (dataset, tokenizer, ignore_index)
    try:
        for done, part in enumerate(_ranges(len(dataset), workers), start=1):
            write(part.tokens, part.labels)
            counts.lengths.append(part.lengths)
            counts.read += part.read
            counts.cut += part.cut
            counts.seen += part.seen
            counts.keys = counts.keys or part.keys
            counts.drops.merge(part.drops)
            after_range(done)
    finally:
        _JOB = None
    return counts

