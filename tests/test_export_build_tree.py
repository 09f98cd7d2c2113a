"""The tree a remote export is built in: one per destination, held for the export."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from kubetune.exporter.build_tree import build_tree, tree_path


def test_two_destinations_build_apart_and_their_names_hold_no_uri(tmp_path):
    first, second = "s3://private-bucket/runs/a", "hf://team/model@main"
    with build_tree(tmp_path, first) as one, build_tree(tmp_path, second) as two:
        assert one != two and one.is_dir() and two.is_dir()
        (one / "adapter_model.safetensors").write_bytes(b"a")
        assert not any(two.iterdir())
        for tree in (one, two):
            assert tree.parent == tmp_path
            assert "private-bucket" not in tree.name and "team" not in tree.name
    assert not one.exists() and not two.exists()


def test_a_killed_exports_tree_is_started_over_and_a_failed_one_is_removed(tmp_path):
    left = tree_path(tmp_path, "s3://b/x")
    left.mkdir()
    (left / "model-00001-of-00002.safetensors").write_bytes(b"half")
    with pytest.raises(RuntimeError):
        with build_tree(tmp_path, "s3://b/x") as tree:
            assert tree == left and not any(tree.iterdir())
            (tree / "README.md").write_text("card")
            raise RuntimeError("the upload failed")
    assert not left.exists()


def test_a_second_export_to_one_destination_waits_for_the_first(tmp_path, caplog):
    entered, order = threading.Event(), []

    def second() -> None:
        entered.wait()
        with build_tree(tmp_path, "s3://b/x") as tree:
            order.append(("second", sorted(p.name for p in tree.iterdir())))

    caplog.set_level(logging.INFO, logger="exporter")
    waiter = threading.Thread(target=second)
    waiter.start()
    with build_tree(tmp_path, "s3://b/x") as tree:
        (tree / "README.md").write_text("first's")
        entered.set()
        time.sleep(0.5)  # the second is blocked on the lock now
        order.append(("first", sorted(p.name for p in tree.iterdir())))
    waiter.join(10)
    # The second began after the first ended, on an empty tree of its own.
    assert order == [("first", ["README.md"]), ("second", [])]
    assert "another export to s3://b/x is running" in caplog.text


def test_a_tree_a_dead_export_left_goes_and_a_running_ones_stays(tmp_path):
    dead = tree_path(tmp_path, "s3://gone/run")
    (dead / "adapter").mkdir(parents=True)
    (dead / "adapter" / "adapter_model.safetensors").write_bytes(b"half")
    # The one shared tree's name, before each destination had its own.
    older = tmp_path / ".kubetune-staging-export-upload"
    older.mkdir()
    with build_tree(tmp_path, "hf://team/running@main") as running:
        (running / "README.md").write_text("being written")
        with build_tree(tmp_path, "s3://b/x"):
            assert not dead.exists() and not older.exists()
            assert (running / "README.md").read_text() == "being written"
