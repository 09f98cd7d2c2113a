"""A wrong input to `kubetune local` ends with one line naming the step and the cause."""

from __future__ import annotations


import pytest

from tests.support.cli import clean_env, error_lines, kubetune

BAD_INPUT = 65
STEPS = ["dataset-initializer", "model-initializer", "trainer", "exporter"]


def _local(tmp_path, *args):
    term = tmp_path / "termination-log"
    result = kubetune("local", "--workdir", str(tmp_path / "run"), *args,
                      env=clean_env(KUBETUNE_TERMINATION_LOG=str(term)))
    return result, term


def _assert_one_line(result, term, step, *fragments):
    assert result.returncode == BAD_INPUT, result.stdout[-2000:] + result.stderr[-2000:]
    lines = error_lines(result)
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"error: local: {step}: "), line
    for fragment in fragments:
        assert fragment in line, line
    assert term.read_text().strip() == line.removeprefix("error: ")
    assert f"==> {step}: FAILED (exit {BAD_INPUT})" in result.stdout
    later = STEPS[max(STEPS.index(step), 1) + 1:]  # the initializers share a stage
    for name in later:  # nothing ran past the failed step
        assert f"==> {name}:" not in result.stdout


def test_missing_dataset_path(tmp_path):
    result, term = _local(tmp_path, "--dataset", str(tmp_path / "no-such-dataset"))
    _assert_one_line(result, term, "dataset-initializer", "no-such-dataset", "does not exist")


def test_malformed_dataset_uri_names_the_supported_forms(tmp_path):
    result, term = _local(tmp_path, "--dataset", "relative/path")
    _assert_one_line(result, term, "dataset-initializer", "malformed", "file:///abs/path")


def test_unreadable_model_dir(tmp_path, model_copy):
    (model_copy / "config.json").write_text("{not json")
    result, term = _local(tmp_path, "--model", str(model_copy))
    _assert_one_line(result, term, "model-initializer", "config.json")


def test_truncated_weights_are_refused_before_training(tmp_path, model_copy):
    weights = model_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    result, term = _local(tmp_path, "--model", str(model_copy))
    _assert_one_line(result, term, "model-initializer", "model.safetensors", "truncated")
    # The failed initializer left nothing where the trainer looks.
    assert not (tmp_path / "run" / "workspace" / "model").exists()


def test_dataset_without_data_files(tmp_path):
    empty = tmp_path / "empty-dataset"
    empty.mkdir()
    (empty / "README.md").write_text("no data here")
    result, term = _local(tmp_path, "--dataset", str(empty))
    _assert_one_line(result, term, "dataset-initializer", "no data files")


@pytest.mark.slow
def test_trainer_failure_names_the_trainer(tmp_path, tiny_dataset_dir, model_copy):
    # A model directory without its tokenizer passes the initializer (weights and config
    # are fine) but cannot be trained: the trainer must say so before launching.
    (model_copy / "original" / "tokenizer.model").unlink()
    result, term = _local(tmp_path, "--model", str(model_copy))
    _assert_one_line(result, term, "trainer", "tokenizer")
