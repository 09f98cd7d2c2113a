"""What every scheme shares: URI errors, local paths, the initializer image's imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cli import REPO, clean_env, error_lines, kubetune


def test_initializer_imports_pull_no_torch_stack():
    code = ("import sys, kubetune.entrypoints.init_storage, kubetune.initializers.sources.hf, "
            "kubetune.initializers.sources.s3, kubetune.initializers.sources.local\n"
            "print(sorted(m for m in ('torch', 'torchtune', 'omegaconf', 'safetensors', "
            "'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, env=clean_env(), check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("uri, expected", [
    ("gs://bucket/model", "unsupported storage scheme 'gs'; supported forms: /abs/path, "
                          "./rel/path or file:///abs/path, hf://org/name[/sub/path], s3://bucket/prefix"),
    ("org/name", "storage URI 'org/name' is malformed; supported forms: /abs/path, "
                 "./rel/path or file:///abs/path, hf://org/name[/sub/path], s3://bucket/prefix"),
    ("hf://", "storage URI 'hf://' names nothing after hf://"),
    ("s3://Bad_Bucket!/x", "STORAGE_URI 's3://Bad_Bucket!/x' names no valid bucket"),
    ("hf://org/na$me", "STORAGE_URI 'hf://org/na$me' names no valid hub repo id"),
    ("hf://org/../x", "hf URI names no repo"),
])
def test_bad_uris_fail_at_once_with_one_line(tmp_path, uri, expected):
    env = clean_env(STORAGE_URI=uri, OUTPUT_PATH=str(tmp_path / "model"),
                    KUBETUNE_TERMINATION_LOG=str(tmp_path / "termination-log"))
    result = kubetune("init-model", env=env, timeout=60)
    assert result.returncode == 65, result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: model-initializer: {expected}")
    assert expected in (tmp_path / "termination-log").read_text()
    assert "Traceback" not in result.stderr


def test_local_path_and_file_uri(tmp_path, tiny_model_dir):
    for uri, out in ((str(tiny_model_dir), tmp_path / "a"),
                     (f"file://{tiny_model_dir}", tmp_path / "b")):
        result = kubetune("init-model", env=clean_env(STORAGE_URI=uri, OUTPUT_PATH=str(out)),
                          timeout=60)
        assert result.returncode == 0, result.stderr
        manifest = json.loads((out / ".kubetune-manifest.json").read_text())
        assert manifest["storage_uri"] == uri
        assert (out / "model.safetensors").read_bytes() == \
            (tiny_model_dir / "model.safetensors").read_bytes()
    missing = kubetune("init-model", env=clean_env(STORAGE_URI=str(tmp_path / "nope"),
                                                   OUTPUT_PATH=str(tmp_path / "c")), timeout=60)
    assert missing.returncode == 65
    assert error_lines(missing) == [f"error: model-initializer: model source {tmp_path / 'nope'} "
                                    "does not exist"]


@pytest.mark.parametrize("name", ["../x", "a/../../x", "/etc/passwd", "a//b", "~/x", "a\\..\\x",
                                  "link/x"])
def test_names_escaping_the_output_are_refused(tmp_path, name):
    from kubetune.initializers.safe_paths import safe_join
    from kubetune.errors import BadInputError

    root = tmp_path / "out"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)  # a link planted in the tree must not redirect
    with pytest.raises(BadInputError, match="refusing remote file name"):
        safe_join(root, name)
    assert safe_join(root, "a/b.json") == root / "a" / "b.json"


def test_relative_paths_are_read_from_the_working_directory(tmp_path, tiny_model_dir):
    # The user's directory holds the model; the step writes elsewhere. Both relative
    # spellings mean that directory, and the manifest records where it really was, so a
    # later run from another directory is not taken for the same request.
    import shutil

    here = tmp_path / "project"
    shutil.copytree(tiny_model_dir, here / "my-model")
    for uri, expected in (("./my-model", str(here / "my-model")),
                          ("file://./my-model", f"file://{here / 'my-model'}"),
                          ("file://../project/my-model/", f"file://{here / 'my-model'}")):
        out = tmp_path / "out" / uri.replace("/", "_")
        result = kubetune("init-model", env=clean_env(STORAGE_URI=uri, OUTPUT_PATH=str(out)),
                          cwd=here, timeout=60)
        assert result.returncode == 0, result.stderr
        manifest = json.loads((out / ".kubetune-manifest.json").read_text())
        assert manifest["storage_uri"] == expected
        assert (out / "model.safetensors").read_bytes() == \
            (here / "my-model" / "model.safetensors").read_bytes()
    missing = kubetune("init-model", env=clean_env(STORAGE_URI="./no-such-model",
                                                   OUTPUT_PATH=str(tmp_path / "c")),
                       cwd=here, timeout=60)
    assert missing.returncode == 65
    assert error_lines(missing) == [
        f"error: model-initializer: model source {here / 'no-such-model'} does not exist"]
    # A bare name stays malformed (it could be a hub repo id); where a directory of that
    # name is here, the line says how to write it.
    bare = kubetune("init-model", env=clean_env(STORAGE_URI="my-model",
                                                OUTPUT_PATH=str(tmp_path / "d")),
                    cwd=here, timeout=60)
    assert bare.returncode == 65
    assert "malformed" in error_lines(bare)[0] and "write ./my-model" in error_lines(bare)[0]


@pytest.mark.parametrize("uri, base, expected", [
    ("./m", "/home/u", "/home/u/m"),
    ("../m/", "/home/u", "/home/m"),
    (".", "/home/u", "/home/u"),
    ("file://./m", "/home/u", "file:///home/u/m"),
    ("file://../x/m", "/home/u", "file:///home/x/m"),
    ("/abs/m", "/home/u", "/abs/m"),
    ("file:///abs/m", "/home/u", "file:///abs/m"),
    ("s3://bucket/./m", "/home/u", "s3://bucket/./m"),
    ("hf://org/name", "/home/u", "hf://org/name"),
    ("org/name", "/home/u", "org/name"),
])
def test_absolute_changes_only_relative_local_paths(uri, base, expected):
    from pathlib import Path

    from kubetune.storage_uri import absolute

    assert absolute(uri, Path(base)) == expected


def test_export_destination_reads_a_relative_path_from_the_working_directory(
        tmp_path, monkeypatch):
    from kubetune.storage_uri import FileUri, export_destination

    monkeypatch.chdir(tmp_path)
    for uri in ("./exports/run1", "file://./exports/run1"):
        where = export_destination(uri)
        assert isinstance(where, FileUri) and where.path == tmp_path / "exports" / "run1"


def _staged(out) -> dict[str, dict]:
    return {e["path"]: e for e in json.loads((out / ".kubetune-manifest.json").read_text())
            ["files"]}


def test_a_local_source_edited_in_place_is_staged_again(tmp_path, model_copy, caplog):
    """Issue 52 §5: the same file:// URI rerun over a complete result is staged again when
    the source's files changed (content, added, removed); a file only touched is not, and
    its new time is recorded so the next rerun stats it without reading it."""
    import os

    from kubetune.entrypoints.init_storage import run_init

    uri, out = f"file://{model_copy}", tmp_path / "model"
    run_init("model", uri, str(out))
    tokenizer = model_copy / "tokenizer.json"
    before = _staged(out)
    assert before["tokenizer.json"]["source_mtime_ns"] == tokenizer.stat().st_mtime_ns
    # The same size, other bytes: only the content tells. The time is moved on by hand, as
    # an edit on a filesystem with coarse timestamps might not.
    text = tokenizer.read_text()
    edited = text.replace('"truncation": null', '"truncation":null ', 1)
    assert edited != text and len(edited) == len(text)
    tokenizer.write_text(edited)
    os.utime(tokenizer, ns=(before["tokenizer.json"]["source_mtime_ns"] + 10**9,) * 2)
    caplog.set_level("INFO", logger="initializer")
    run_init("model", uri, str(out))
    assert (out / "tokenizer.json").read_text() == edited
    assert "changed since it was staged" in caplog.text and "(tokenizer.json)" in caplog.text
    assert _staged(out)["tokenizer.json"]["sha256"] != before["tokenizer.json"]["sha256"]

    # Touched, not changed: nothing staged again; the manifest takes the new time.
    caplog.clear()
    weights = model_copy / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_mtime_ns + 10**9,) * 2)
    run_init("model", uri, str(out))
    assert "nothing to download" in caplog.text and "changed since" not in caplog.text
    assert _staged(out)["model.safetensors"]["source_mtime_ns"] == weights.stat().st_mtime_ns

    # A file gone from the source is gone from the staged tree; one added is staged.
    (model_copy / "special_tokens_map.json").rename(model_copy / "added.json")
    run_init("model", uri, str(out))
    assert not (out / "special_tokens_map.json").exists()
    assert (out / "added.json").is_file() and "added.json" in _staged(out)


def test_a_step_runs_from_a_folder_holding_a_clone_named_kubetune(tmp_path, monkeypatch,
                                                                 tiny_dataset_dir, capsys):
    """Issue 52 §6: `kubetune local` from the folder that holds a clone named `kubetune`
    (the default clone name) ran its steps' `python -m kubetune...` with that folder
    first on sys.path: ImportError on the clone's kubetune/__init__.py."""
    from kubetune.entrypoints.local import pipeline
    from kubetune.tools.local.steps import run_process

    (tmp_path / "kubetune").mkdir()
    (tmp_path / "kubetune" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    [initializers, _, _] = pipeline(tmp_path / "work", "file:///unused",
                                    f"file://{tiny_dataset_dir}", "lora", [], None)
    step = next(s for s in initializers if s.name == "dataset-initializer")
    result = run_process(step, logs)
    assert result.exit_code == 0, (result.error, capsys.readouterr().out[-2000:])
    assert (tmp_path / "work" / "workspace" / "dataset" / ".kubetune-manifest.json").is_file()
