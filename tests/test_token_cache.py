"""The dataset is tokenized once into a cache on the volume, and what the recipe trains on
is what torchtune would have given it: the same rows, the same packs, batch by batch.

These run the recipe's own data setup (torchtune's ``_setup_data``, wrapped as in a
training run) in the test process, on alpaca-like rows with a share of prompts longer
than the context; the training runs that use it are in test_trainer_long_rows.py.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kubetune.tools.demo.alpaca_like import write_alpaca_like
from kubetune.trainer.data.token_cache import store
from kubetune.trainer.data.token_cache.rows import IN_USE_NAME, META_NAME
from tests.support.cli import REPO, clean_env
from kubetune.trainer.performance.cpu_cores import usable_cores
from kubetune.workspace.training_samples import read_training_samples
from tests.support.token_cache import entries, instruct, setup_data


@pytest.fixture(scope="module")
def long_rows(tmp_path_factory) -> Path:
    """600 alpaca-like rows in 3 shards; a fifth of the prompts are longer than 256 tokens."""
    root = tmp_path_factory.mktemp("long-rows")
    write_alpaca_like(root, 600, 3, scale=0.25, long_prompts=0.2, long_chars=400)
    return root


def batches(loader) -> list[dict]:
    return [{k: v for k, v in batch.items() if k != "mask"} for batch in loader]


def same_batches(ours, theirs) -> None:
    mine, upstream = batches(ours), batches(theirs)
    assert len(mine) == len(upstream) > 0
    for index, (a, b) in enumerate(zip(mine, upstream)):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (index, key)


def same_packs(ours, theirs) -> None:
    assert len(ours) == len(theirs) > 0
    for index in range(len(theirs)):
        a, b = ours[index], theirs[index]
        assert a.keys() == b.keys()
        for key in b:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (index, key)


def trainable(row: dict) -> bool:
    """What the recipe trains on: a label after the first (it shifts them by one)."""
    return any(int(label) != -100 for label in row["labels"][1:])


@pytest.mark.parametrize("dataset,expect_dropped", [
    ({"_component_": "torchtune.datasets.instruct_dataset", "train_on_input": True}, False),
    ({"_component_": "torchtune.datasets.text_completion_dataset", "column": "input",
      "split_across_pack": True}, False),
    ({"_component_": "tests.support.dataset_builders.capped_packs", "max_packs": 40}, True),
    ({"_component_": "torchtune.datasets.instruct_dataset"}, True),
], ids=["whole-rows", "split-rows", "max-packs-and-pad-id", "untrainable-rows-dropped"])
def test_packs_are_torchtunes_pack_by_pack(tmp_path, tiny_model_dir, long_rows, dataset,
                                           expect_dropped):
    section = {**instruct(long_rows), **dataset, "packed": True}
    ours = setup_data(tmp_path / "cache", tiny_model_dir, section, max_seq_len=256)
    assert len(entries(tmp_path / "cache")) == 1  # read from the cache entry, not memory
    assert not isinstance(ours.dataset.packs, list)
    if not expect_dropped:
        theirs = setup_data(False, tiny_model_dir, section, max_seq_len=256)
        same_packs(ours.dataset, theirs.dataset)
        same_batches(ours, theirs)
        return
    # torchtune packs every row; ours leaves out the rows with nothing to train on, and
    # packs the rest exactly as torchtune packs them.
    from torch.utils.data import Subset
    from torchtune.datasets import PackedDataset

    unpacked = setup_data(False, tiny_model_dir, instruct(long_rows), max_seq_len=256).dataset
    kept = [i for i in range(len(unpacked)) if trainable(unpacked[i])]
    assert 0 < len(kept) < len(unpacked)
    theirs = setup_data(False, tiny_model_dir, section, max_seq_len=256).dataset
    same_packs(ours.dataset, PackedDataset(
        Subset(unpacked, kept), max_seq_len=256, padding_idx=theirs.padding_idx,
        max_packs=theirs.max_packs, split_across_pack=theirs.split_across_pack))


def test_rows_are_torchtunes_and_untrainable_ones_are_counted(tmp_path, tiny_model_dir,
                                                              long_rows, caplog, capsys):
    section = instruct(long_rows)
    with caplog.at_level(logging.INFO, logger="trainer"):
        ours = setup_data(tmp_path / "cache", tiny_model_dir, section, max_seq_len=256)
    logged = [r.getMessage() for r in caplog.records]
    [cut] = [line for line in capsys.readouterr().out.splitlines() if "were cut" in line]
    assert cut.startswith("train: ") and " of 600 samples are longer than " \
        "tokenizer.max_seq_len=256" in cut
    # A run that maps the entry says the same, without tokenizing again.
    setup_data(tmp_path / "cache", tiny_model_dir, section, max_seq_len=256)
    assert [line for line in capsys.readouterr().out.splitlines() if "were cut" in line] == [cut]
    upstream = setup_data(False, tiny_model_dir, section, max_seq_len=256).dataset
    kept = [upstream[i] for i in range(len(upstream)) if trainable(upstream[i])]
    assert len(ours.dataset) == len(kept) < len(upstream)
    for index in range(len(kept)):
        row = ours.dataset[index]
        assert row["tokens"] == kept[index]["tokens"]
        assert row["labels"] == [int(x) for x in kept[index]["labels"]]
        assert row["mask"] == kept[index]["mask"]
    # The drop's own line (the cut rows and the setting to change) ...
    [line] = [message for message in logged if message.startswith("train: dropped")]
    # ... and the run's row counts (issue 54), which name the dropped rows too.
    [counts] = [message for message in logged if " rows read, " in message]
    dropped = len(upstream) - len(kept)
    assert counts.startswith(f"train: {len(upstream)} rows read, {dropped} dropped "
                             f"({dropped} no token to train on (row ")
    assert counts.endswith(f", {len(kept)} trained")
    assert line.startswith(f"train: dropped {len(upstream) - len(kept)} of {len(upstream)} "
                           "rows with no token to train on after truncation to "
                           "tokenizer.max_seq_len=256")
    assert "dataset.train_on_input=True" in line


def test_a_list_of_datasets_is_cached_dataset_by_dataset(tmp_path, tiny_model_dir, long_rows):
    sections = [instruct(long_rows, train_on_input=True),
                {**instruct(long_rows), "_component_": "torchtune.datasets.text_completion_dataset",
                 "column": "output"}]
    ours = setup_data(tmp_path / "cache", tiny_model_dir, sections, max_seq_len=256)
    assert len(entries(tmp_path / "cache")) == 2
    same_batches(ours, setup_data(False, tiny_model_dir, sections, max_seq_len=256))


def test_chat_rows_are_torchtunes(tmp_path, tiny_model_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    conversations = [{"messages": [
        {"role": "system", "content": "You add numbers."},
        *[m for turn in range(1 + i % 3) for m in (
            {"role": "user", "content": f"What is {i} plus {turn}? " * (1 + i % 7)},
            {"role": "assistant", "content": f"{i + turn}."})]]} for i in range(120)]
    (tmp_path / "chat").mkdir()
    pq.write_table(pa.Table.from_pylist(conversations), tmp_path / "chat" / "train.parquet")
    section = {**instruct(tmp_path / "chat"), "_component_": "torchtune.datasets.chat_dataset",
               "conversation_column": "messages", "conversation_style": "openai"}
    ours = setup_data(tmp_path / "cache", tiny_model_dir, section, max_seq_len=128)
    assert len(entries(tmp_path / "cache")) == 1
    upstream = setup_data(False, tiny_model_dir, section, max_seq_len=128).dataset
    kept = [upstream[i] for i in range(len(upstream)) if trainable(upstream[i])]
    assert [ours.dataset[i]["tokens"] for i in range(len(ours.dataset))] == \
        [row["tokens"] for row in kept]
    assert [ours.dataset[i]["labels"] for i in range(len(ours.dataset))] == \
        [[int(x) for x in row["labels"]] for row in kept]


def test_a_builder_whose_rows_are_not_tokens_and_labels_is_used_as_built(tmp_path,
                                                                         tiny_model_dir,
                                                                         long_rows):
    section = {**instruct(long_rows), "_component_": "tests.support.dataset_builders.tagged_rows"}
    ours = setup_data(tmp_path / "cache", tiny_model_dir, section, max_seq_len=256)
    assert entries(tmp_path / "cache") == []
    assert ours.dataset[3]["row"] == 3


def test_a_100k_row_sharded_set_is_tokenized_once(tmp_path, tiny_model_dir, caplog):
    data = tmp_path / "dataset"
    write_alpaca_like(data, 100_000, 4, scale=0.25)
    section = instruct(data)
    cache = tmp_path / "cache"
    with caplog.at_level(logging.INFO, logger="trainer"):
        first = setup_data(cache, tiny_model_dir, section, max_seq_len=2048)
    [entry] = entries(cache)
    meta = json.loads((entry / META_NAME).read_text())
    assert meta["rows_read"] == 100_000 and meta["rows"] == len(first.dataset) == 100_000
    assert meta["build_workers"] == usable_cores()  # tokenized in parallel
    built = {p.name: p.stat().st_mtime_ns for p in entry.iterdir() if p.name != IN_USE_NAME}
    caplog.clear()

    with caplog.at_level(logging.INFO, logger="trainer"):
        second = setup_data(cache, tiny_model_dir, section, max_seq_len=2048)
    assert entries(cache) == [entry]
    assert {p.name: p.stat().st_mtime_ns for p in entry.iterdir()
            if p.name != IN_USE_NAME} == built  # mapped, not rewritten
    messages = [r.getMessage() for r in caplog.records]
    assert any("100000 rows mapped from" in m for m in messages), messages
    assert not any("tokenized" in m for m in messages), messages

    upstream = setup_data(False, tiny_model_dir, section, max_seq_len=2048).dataset
    for index in list(range(0, 100_000, 331)) + [99_999]:
        assert second.dataset[index]["tokens"] == upstream[index]["tokens"], index
        assert second.dataset[index]["labels"] == [int(x) for x in upstream[index]["labels"]]
    assert next(iter(first)).keys() == next(iter(second)).keys()
    assert torch.equal(next(iter(first))["tokens"], next(iter(second))["tokens"])


def _rewrite_one_row(data: Path) -> None:
    import pyarrow.parquet as pq

    shard = sorted(data.rglob("*.parquet"))[1]
    table = pq.read_table(shard).to_pylist()
    table[5]["output"] = "A different answer."
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(table), shard)


@pytest.mark.parametrize("change", ["max_seq_len", "train_on_input", "a data file"])
def test_a_change_to_what_the_tokens_depend_on_builds_a_new_entry(tmp_path, tiny_model_dir,
                                                                  change):
    data = tmp_path / "dataset"
    write_alpaca_like(data, 300, 3, scale=0.25, long_prompts=0.2, long_chars=400)
    cache = tmp_path / "cache"
    before = setup_data(cache, tiny_model_dir, instruct(data), max_seq_len=256)
    old = [before.dataset[i]["labels"] for i in range(len(before.dataset))]
    max_seq_len, extra = 256, {}
    if change == "max_seq_len":
        max_seq_len = 384
    elif change == "train_on_input":
        extra = {"train_on_input": True}
    else:
        _rewrite_one_row(data)
    after = setup_data(cache, tiny_model_dir, instruct(data, **extra), max_seq_len=max_seq_len)
    assert len(entries(cache)) == 2
    assert [after.dataset[i]["labels"] for i in range(len(after.dataset))] != old
    upstream = setup_data(False, tiny_model_dir, instruct(data, **extra),
                          max_seq_len=max_seq_len).dataset
    kept = [upstream[i] for i in range(len(upstream)) if trainable(upstream[i])]
    assert [after.dataset[i]["tokens"] for i in range(len(after.dataset))] == \
        [row["tokens"] for row in kept]


_BUILD = """
import sys
from pathlib import Path
from tests.support.token_cache import instruct, setup_data
setup_data(Path(sys.argv[1]), Path(sys.argv[2]), instruct(Path(sys.argv[3])), max_seq_len=256)
"""


@pytest.fixture(scope="module")
def enough_rows(tmp_path_factory, tiny_model_dir) -> tuple[Path, list[dict]]:
    """3000 rows (enough to tokenize with a pool of workers), and their rows as cached."""
    data = tmp_path_factory.mktemp("enough-rows")
    write_alpaca_like(data, 3000, 3, scale=0.25, long_prompts=0.1, long_chars=400)
    loader = setup_data(tmp_path_factory.mktemp("reference-cache"), tiny_model_dir,
                        instruct(data), max_seq_len=256)
    return data, [loader.dataset[i] for i in range(len(loader.dataset))]


@pytest.mark.parametrize("point", store.KILL_POINTS)
def test_a_build_killed_at_any_point_leaves_nothing_the_next_run_trusts(tmp_path,
                                                                       tiny_model_dir,
                                                                       enough_rows, point):
    data, reference = enough_rows
    cache = tmp_path / "cache"
    killed = subprocess.run(
        [sys.executable, "-c", _BUILD, str(cache), str(tiny_model_dir), str(data)], cwd=REPO,
        env=clean_env(KUBETUNE_TEST_KILL_TOKEN_CACHE_AT=point), capture_output=True,
        text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert f"killing the builder at {point}" in killed.stderr
    assert entries(cache) == []  # a staging directory at most, which nothing reads

    again = setup_data(cache, tiny_model_dir, instruct(data), max_seq_len=256)
    assert len(entries(cache)) == 1
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []  # cleaned up
    assert [again.dataset[i] for i in range(len(again.dataset))] == reference


def test_a_cache_directory_that_cannot_be_written_warns_once_and_tokenizes_anyway(
        tmp_path, tiny_model_dir, long_rows, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.INFO, logger="trainer"):
        ours = setup_data(blocker / "cache", tiny_model_dir, instruct(long_rows),
                          max_seq_len=256)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "token cache" in r.getMessage()]
    assert warnings == [f"token cache: {blocker / 'cache'} cannot hold it (Not a directory): "
                        "tokenized into a private temporary directory for this process only "
                        "(the run goes on; the next one tokenizes again)"]
    theirs = setup_data(tmp_path / "cache", tiny_model_dir, instruct(long_rows),
                        max_seq_len=256)
    same_batches(ours, theirs)


_FULL_VOLUME = """
import resource, signal, sys
from pathlib import Path
from datasets import load_dataset
from tests.support.token_cache import instruct, setup_data
# `datasets` converts the parquet files into its own cache first, as a pod would have.
load_dataset("parquet", data_files=instruct(Path(sys.argv[3]))["data_files"], split="train")
# Every file this process writes stops growing at 64 KiB (EFBIG), as on a full volume.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
loader = setup_data(Path(sys.argv[1]), Path(sys.argv[2]), instruct(Path(sys.argv[3])),
                    max_seq_len=256)
print("rows", len(loader.dataset), sum(len(loader.dataset[i]["tokens"])
                                       for i in range(len(loader.dataset))))
"""


def test_a_volume_that_fills_up_while_building_warns_once_and_tokenizes_in_memory(
        tmp_path, tiny_model_dir, long_rows):
    cache = tmp_path / "cache"
    full = subprocess.run([sys.executable, "-c", _FULL_VOLUME, str(cache), str(tiny_model_dir),
                           str(long_rows)], cwd=REPO, env=clean_env(), capture_output=True,
                          text=True, timeout=300)
    assert full.returncode == 0, full.stderr[-3000:]
    warnings = [line for line in full.stderr.splitlines() if "token cache:" in line]
    assert len(warnings) == 1 and "tokenized into memory" in warnings[0], full.stderr[-3000:]
    assert "cannot hold it (File too large)" in warnings[0]
    assert list(cache.iterdir()) == []  # the partial entry is gone
    reference = setup_data(tmp_path / "reference", tiny_model_dir, instruct(long_rows),
                           max_seq_len=256).dataset
    tokens = sum(len(reference[i]["tokens"]) for i in range(len(reference)))
    assert f"rows {len(reference)} {tokens}" in full.stdout


def entry_of(cache: Path, max_seq_len: int) -> Path:
    [entry] = [e for e in entries(cache)
               if json.loads((e / META_NAME).read_text())["max_seq_len"] == max_seq_len]
    return entry


def test_old_entries_are_removed_but_never_one_in_use(tmp_path, tiny_model_dir, long_rows):
    import fcntl
    import gc

    cache = tmp_path / "cache"
    for max_seq_len in (128, 192, 256):
        setup_data(cache, tiny_model_dir, instruct(long_rows), max_seq_len=max_seq_len)
    gc.collect()  # those loaders are done with: their entries are no longer mapped here
    old, in_use, recent = (entry_of(cache, n) for n in (128, 192, 256))
    month_ago = os.stat(old / IN_USE_NAME).st_mtime - 30 * 86400
    for entry in (old, in_use):
        os.utime(entry / IN_USE_NAME, (month_ago, month_ago))
    # Another run maps `in_use` (it holds the entry's shared lock as long as it runs).
    with open(in_use / IN_USE_NAME, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        setup_data(cache, tiny_model_dir, instruct(long_rows), max_seq_len=320)
        gc.collect()
        assert old not in entries(cache) and in_use in entries(cache)
        newest = entry_of(cache, 320)
        assert set(entries(cache)) == {in_use, recent, newest}
        # Beyond the most recent N, the least recently used go too, not the one in use.
        assert store.prune(cache, keep=newest.name, max_entries=1) == [recent.name]
        assert set(entries(cache)) == {in_use, newest}


def _planned_cache_dir(result: subprocess.CompletedProcess) -> str:
    import yaml

    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load(result.stdout.split("config:\n", 1)[1].split("\ncommand:", 1)[0])
    return config["kubetune"]["token_cache_dir"]


def test_the_cache_is_on_the_volume_unless_told_otherwise(tmp_path, tiny_model_dir,
                                                         tiny_dataset_dir):
    from tests.support.cli import kubetune

    def plan(*args: str, **env: str) -> str:
        return _planned_cache_dir(kubetune(
            "train", "--model-dir", str(tiny_model_dir), "--dataset-dir",
            str(tiny_dataset_dir), "--output-dir", str(tmp_path / "run" / "output"),
            "--dry-run", *args, env=clean_env(**env)))

    workspace = tmp_path / "pvc"
    workspace.mkdir()
    assert plan(KUBETUNE_WORKSPACE=str(workspace)) == str(workspace / "cache" / "tokens")
    # No workspace (a laptop): beside the output directory, as in a workspace.
    assert plan(KUBETUNE_WORKSPACE=str(tmp_path / "none")) == \
        str(tmp_path / "run" / "cache" / "tokens")
    # Option > variable > default.
    assert plan(KUBETUNE_TOKEN_CACHE_DIR="/var/cache/x") == "/var/cache/x"
    assert plan("--token-cache-dir", "/opt/y", KUBETUNE_TOKEN_CACHE_DIR="/var/cache/x") == \
        "/opt/y"


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packs"])
def test_training_samples_are_recorded_from_a_built_entry_and_from_a_mapped_one(
        tmp_path, tiny_model_dir, long_rows, packed):
    """The exporter's chat-template check reads the samples the trainer fed: the recorder
    sees the tokenizer while the entry is built, and draws from the rows the entry was made
    from where it is mapped (no tokenizing at all)."""
    section = {**instruct(long_rows), "packed": packed}
    for run in ("built", "mapped"):
        out = tmp_path / run
        out.mkdir()
        loader = setup_data(tmp_path / "cache", tiny_model_dir, section, max_seq_len=256,
                            samples_dir=out)
        rows = loader.dataset.ds if packed else loader.dataset
        fed = [rows[i]["tokens"] for i in range(len(rows))]
        found = read_training_samples(out, "test")
        assert found is not None and len(found.samples) == 4, run
        for sample in found.samples:
            assert sample.tokens in fed, run
    assert len(entries(tmp_path / "cache")) == 1
