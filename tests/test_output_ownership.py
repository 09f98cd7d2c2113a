"""An initializer never loses, nor shares, a user's data (issue 22).

What a user would check: files of their own beside the output survive (the step refuses,
naming them); a file, or a symlink to nothing, at OUTPUT_PATH (or the exporter's local
destination) is not replaced by a directory, and a symlink to a directory is filled where
it points; an output filled from
``file://`` is a copy (editing it leaves the source alone); and nothing of ours is left
beside the output after a run that succeeded or failed with one line.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.cli import clean_env, error_lines, kubetune

MANIFEST = ".kubetune-manifest.json"


def init(kind: str, source: Path | str, out: Path, **extra: str):
    env = clean_env(STORAGE_URI=str(source), OUTPUT_PATH=str(out),
                    KUBETUNE_TERMINATION_LOG=str(out.parent / "termination-log"), **extra)
    return kubetune(f"init-{kind}", env=env, timeout=120)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def ours_beside(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob(".kubetune-staging*"))


def one_line_65(result, out: Path) -> str:
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    assert "Traceback" not in result.stderr
    assert (out.parent / "termination-log").read_text().strip() == line.removeprefix("error: ")
    return line


@pytest.mark.parametrize("kind", ["model", "dataset"])
@pytest.mark.parametrize("form", ["path", "file://"])
def test_an_output_from_a_local_source_shares_no_inode_with_it(
        kind, form, tmp_path, tiny_model_dir, tiny_dataset_dir):
    source = Path(shutil.copytree(tiny_model_dir if kind == "model" else tiny_dataset_dir,
                                  tmp_path / "src"))
    before = tree(source)
    out = tmp_path / "ws" / kind
    result = init(kind, f"file://{source}" if form == "file://" else source, out)
    assert result.returncode == 0, result.stderr[-2000:]
    listed = [e["path"] for e in json.loads((out / MANIFEST).read_text())["files"]
              if (source / e["path"]).is_file()]
    assert listed
    for rel in listed:
        assert os.stat(out / rel).st_ino != os.stat(source / rel).st_ino, rel
        with open(out / rel, "r+b") as handle:  # a user (or a step) edits the output
            handle.write(b"edited")
    assert tree(source) == before


def test_a_changed_request_never_links_a_file_a_source_shares(tmp_path, model_copy):
    """An output an older version filled by hard links from the source: the next result,
    which starts from the earlier files, must not carry the shared inode on."""
    out = tmp_path / "ws" / "model"
    first = init("model", model_copy, out, IGNORE_PATTERNS="tokenizer.json")
    assert first.returncode == 0, first.stderr[-2000:]
    (out / "model.safetensors").unlink()
    os.link(model_copy / "model.safetensors", out / "model.safetensors")  # the old way
    changed = init("model", model_copy, out)
    assert changed.returncode == 0, changed.stderr[-2000:]
    assert "from an earlier request" in changed.stderr  # the earlier files were reused
    for rel in ("model.safetensors", "config.json"):
        assert os.stat(out / rel).st_ino != os.stat(model_copy / rel).st_ino, rel


def test_a_user_s_files_in_an_empty_looking_output_are_kept_and_named(tmp_path, tiny_model_dir):
    out = tmp_path / "model"
    (out / "mine").mkdir(parents=True)
    (out / "notes.txt").write_text("a user's notes")
    (out / "mine" / "draft.md").write_text("draft")
    for name in ("a.bin", "b.bin", "c.bin"):
        (out / name).write_bytes(b"x")
    result = init("model", tiny_model_dir, out)
    line = one_line_65(result, out)
    assert "OUTPUT_PATH" in line and str(out) in line and "a.bin" in line
    assert "and 2 more" in line  # five foreign entries, three named
    assert tree(out) == {"a.bin": b"x", "b.bin": b"x", "c.bin": b"x",
                         "mine/draft.md": b"draft", "notes.txt": b"a user's notes"}
    assert ours_beside(tmp_path) == []


def test_a_user_s_file_beside_an_earlier_result_survives_a_changed_request(
        tmp_path, tiny_model_dir):
    out = tmp_path / "model"
    first = init("model", tiny_model_dir, out, IGNORE_PATTERNS="tokenizer.json")
    assert first.returncode == 0, first.stderr[-2000:]
    (out / "notes.txt").write_text("what I tried")
    earlier = tree(out)
    changed = init("model", tiny_model_dir, out)  # a new request replaces the tree...
    line = one_line_65(changed, out)
    assert "notes.txt" in line and "move them away" in line
    assert tree(out) == earlier  # ...but never the user's file, nor the earlier result
    assert ours_beside(tmp_path) == []
    # The same request as before is still satisfied: nothing to replace, nothing refused.
    again = init("model", tiny_model_dir, out, IGNORE_PATTERNS="tokenizer.json")
    assert again.returncode == 0 and "nothing to download" in again.stderr
    (out / "notes.txt").unlink()
    fixed = init("model", tiny_model_dir, out)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert (out / "tokenizer.json").is_file()


@pytest.mark.parametrize("kind", ["model", "dataset"])
def test_a_file_at_output_path_is_refused_and_kept(kind, tmp_path, tiny_model_dir,
                                                   tiny_dataset_dir):
    out = tmp_path / kind
    out.write_text("not a directory")
    source = tiny_model_dir if kind == "model" else tiny_dataset_dir
    for _ in range(2):  # a re-run says the same, never NotADirectoryError
        line = one_line_65(init(kind, source, out), out)
        assert f"OUTPUT_PATH {out} is a file" in line
        assert out.read_text() == "not a directory"
    assert ours_beside(tmp_path) == []


@pytest.mark.parametrize("kind", ["model", "dataset"])
def test_a_dangling_symlink_at_output_path_is_refused_and_kept(kind, tmp_path, tiny_model_dir,
                                                               tiny_dataset_dir):
    """A link to a volume that is not mounted (yet): the data goes nowhere else."""
    out, target = tmp_path / kind, tmp_path / "not-mounted" / kind
    out.symlink_to(target)
    source = tiny_model_dir if kind == "model" else tiny_dataset_dir
    line = one_line_65(init(kind, source, out), out)
    assert f"OUTPUT_PATH {out} is a symlink to {target}, which does not exist" in line
    assert out.is_symlink() and os.readlink(out) == str(target)
    assert not (tmp_path / "not-mounted").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [kind, "termination-log"]


def test_a_dangling_symlink_as_export_destination_is_refused_and_kept(tmp_path, trained_run):
    out, target = tmp_path / "export", tmp_path / "not-mounted" / "export"
    out.symlink_to(target)
    result = kubetune("export", env=clean_env(
   KUBETUNE_WORKSPACE=str(trained_run.workspace), EXPORT_URI=str(out),
   KUBETUNE_TERMINATION_LOG=str(tmp_path / "termination-log")), timeout=300)
    line = one_line_65(result, out)
    assert f"export destination {out} is a symlink to {target}, which does not exist" in line
    assert out.is_symlink() and os.readlink(out) == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "termination-log"]


def test_a_symlink_at_output_path_is_filled_where_it_points(tmp_path, model_copy):
    """A link to a bigger volume: the data goes there, the link stays."""
    target = tmp_path / "big" / "model"
    target.mkdir(parents=True)
    out = tmp_path / "ws" / "model"
    out.parent.mkdir()
    out.symlink_to(target)
    for expected in ("model is ready at", "nothing to download"):
        result = init("model", model_copy, out)
        assert result.returncode == 0 and expected in result.stderr, result.stderr[-2000:]
        assert out.is_symlink() and os.readlink(out) == str(target)
        assert (target / MANIFEST).is_file() and (target / "config.json").is_file()
        assert sorted(p.name for p in out.parent.iterdir()) == ["model"]
        assert sorted(p.name for p in target.parent.iterdir()) == ["model"]


def test_a_symlink_as_export_destination_is_filled_where_it_points(tmp_path, trained_run):
    target = tmp_path / "big" / "export"
    target.mkdir(parents=True)
    out = tmp_path / "export"
    out.symlink_to(target)
    result = kubetune("export", env=clean_env(
   KUBETUNE_WORKSPACE=str(trained_run.workspace), EXPORT_URI=str(out)), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert out.is_symlink() and (target / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "export"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["export"]


def test_nothing_of_ours_is_left_after_success_nor_after_a_one_line_failure(
        tmp_path, model_copy):
    ok = init("model", model_copy, tmp_path / "ok" / "model")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "ok").iterdir()) == ["model"]
    # A failure found after the download (a model without config.json): staged, then refused.
    (model_copy / "config.json").unlink()
    bad = init("model", model_copy, tmp_path / "bad" / "model")
    line = one_line_65(bad, tmp_path / "bad" / "model")
    assert "config.json" in line
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == ["termination-log"]


def test_a_killed_run_s_leftovers_are_cleaned_by_the_next(tmp_path, model_copy):
    out = tmp_path / "model"
    staged = tmp_path / ".kubetune-staging-model"
    staged.mkdir()
    (staged / "config.json.part").write_bytes(b"{")
    (tmp_path / ".kubetune-staging-model.lock").write_text("")
    result = init("model", model_copy, out)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model-src"]
