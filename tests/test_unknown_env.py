"""A misspelled KUBETUNE_* variable is named with the one it stands for, not ignored in
silence; a known one is not mentioned."""

from __future__ import annotations

from tests.support.cli import clean_env, error_lines, kubetune


def test_a_typo_in_a_kubetune_variable_is_warned_with_the_name_it_stands_for(tmp_path):
    target = tmp_path / "model"
    result = kubetune("init-model", env=clean_env(
        STORAGE_URI=f"file://{tmp_path / 'no-such-model'}", OUTPUT_PATH=str(target),
        KUBETUNE_TERMINATION_LOG=str(tmp_path / "termination-log"),
        KUBETUNE_EPOCH="3", KUBETUNE_LOG_LEVEL="info"))
    warnings = [line for line in result.stderr.splitlines() if "unknown environment" in line]
    assert warnings == [warnings[0]] and "KUBETUNE_EPOCH (did you mean KUBETUNE_EPOCHS?)" \
        in warnings[0], result.stderr
    # The warning is no failure: the step fails (or not) for its own reason, once.
    assert result.returncode == 65 and len(error_lines(result)) == 1
    assert "KUBETUNE_LOG_LEVEL" not in warnings[0]
