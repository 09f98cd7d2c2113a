"""A wrong input to `kubetune local` ends with one line naming the cause and where it was
found: a source that is missing or broken before any step starts (naming the option, in
the words of the initializer that would have found it), anything else by the step."""

from __future__ import annotations

from tests.support.cli import clean_env, error_lines, kubetune
from tests.support.hub_server import HubServer

BAD_INPUT = 65
STEPS = ["dataset-initializer", "model-initializer", "trainer", "exporter"]


def _local(tmp_path, *args):
    term = tmp_path / "termination-log"
    result = kubetune("local", "--workdir", str(tmp_path / "run"), *args,
                      env=clean_env(KUBETUNE_TERMINATION_LOG=str(term)))
    return result, term


def _assert_found_before_any_step(result, term, tmp_path, option, *fragments):
    assert result.returncode == BAD_INPUT, result.stdout[-2000:] + result.stderr[-2000:]
    lines = error_lines(result)
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"error: local: {option}"), line
    for fragment in fragments:
        assert fragment in line, line
    assert term.read_text().strip() == line.removeprefix("error: ")
    assert "==> " not in result.stdout  # no step started
    assert not (tmp_path / "run" / "workspace").exists()  # nothing staged


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
    _assert_found_before_any_step(result, term, tmp_path, "--dataset",
                                  str(tmp_path / "no-such-dataset"), "does not exist")


def test_malformed_dataset_uri_names_the_supported_forms(tmp_path):
    result, term = _local(tmp_path, "--dataset", "relative/path")
    _assert_found_before_any_step(result, term, tmp_path, "--dataset", "malformed",
                                  "file:///abs/path")


def test_unreadable_model_dir(tmp_path, model_copy):
    (model_copy / "config.json").write_text("{not json")
    result, term = _local(tmp_path, "--model", str(model_copy))
    _assert_found_before_any_step(result, term, tmp_path, f"--model {model_copy}",
                                  "config.json does not parse")


def test_truncated_weights_are_refused_before_training(tmp_path, model_copy):
    weights = model_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    result, term = _local(tmp_path, "--model", str(model_copy))
    _assert_found_before_any_step(result, term, tmp_path, f"--model {model_copy}",
                                  "model.safetensors", "truncated")


def test_dataset_without_data_files(tmp_path):
    empty = tmp_path / "empty-dataset"
    empty.mkdir()
    (empty / "README.md").write_text("no data here")
    result, term = _local(tmp_path, "--dataset", str(empty))
    _assert_found_before_any_step(result, term, tmp_path, f"--dataset {empty}",
                                  "no data files")


def test_model_the_trainer_cannot_use_fails_before_any_step(tmp_path, model_copy):
    # A model directory without its tokenizer passes the initializer (weights and config
    # are fine) but cannot be trained: the trainer's plan, run on the source, says so.
    # (With its tokenizer.json left, that would train: test_fast_tokenizer.)
    (model_copy / "original" / "tokenizer.model").unlink()
    (model_copy / "tokenizer.json").unlink()
    result, term = _local(tmp_path, "--model", str(model_copy))
    _assert_found_before_any_step(result, term, tmp_path, "tokenizer ",
                                  "original/tokenizer.model is missing")


def test_what_only_a_step_can_see_is_reported_by_that_step(tmp_path):
    # A hub repo that is not there: only the model initializer asks the hub. The checks
    # before it passed (a well-formed URI; the trainer arguments need no checkpoint).
    hub = HubServer().start()
    try:
        term = tmp_path / "termination-log"
        result = kubetune("local", "--workdir", str(tmp_path / "run"), "--model",
                          "hf://org/nothere", "epochs=1",
                          env=clean_env(KUBETUNE_TERMINATION_LOG=str(term),
                                        HF_ENDPOINT=hub.url))
    finally:
        hub.stop()
    _assert_one_line(result, term, "model-initializer", "model repo org/nothere not found")
