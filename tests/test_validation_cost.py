"""Each evaluation measures the first held-out rows within about 5% of the run's compute."""

from __future__ import annotations

from types import SimpleNamespace

from kubetune.trainer.validation import budget


class Rows:
    """A cached dataset's shape: its length and its entry's token count."""

    def __init__(self, rows: int, tokens: int | None) -> None:
        self._rows = rows
        self.rows = SimpleNamespace(meta={"tokens": tokens} if tokens else {})

    def __len__(self) -> int:
        return self._rows


def cost(kept: int, heldout: Rows, train: Rows, epochs: int, evaluations: int) -> float:
    per_row = heldout.rows.meta["tokens"] / len(heldout)
    return evaluations * kept * per_row / (3 * train.rows.meta["tokens"] * epochs)


def test_a_large_test_split_is_measured_within_five_percent():
    train, heldout = Rows(52_000, 52_000 * 180), Rows(5_200, 5_200 * 180)
    kept = budget.rows_per_evaluation(heldout, train, epochs=1, evaluations=12)
    assert budget.MIN_ROWS < kept < 5_200
    assert 0.045 < cost(kept, heldout, train, 1, 12) <= 0.05


def test_a_small_held_out_set_is_measured_whole():
    assert budget.rows_per_evaluation(Rows(32, 600), Rows(128, 2_400), 1, 12) == 32
    # at least MIN_ROWS where the budget allows fewer (a loss over a handful says little)
    assert budget.rows_per_evaluation(Rows(900, 90_000), Rows(1_000, 100_000), 1, 12) \
        == budget.MIN_ROWS


def test_longer_training_allows_more_held_out_rows():
    heldout, train = Rows(20_000, 2_000_000), Rows(40_000, 4_000_000)
    one = budget.rows_per_evaluation(heldout, train, epochs=1, evaluations=12)
    three = budget.rows_per_evaluation(heldout, train, epochs=3, evaluations=12)
    assert three == min(20_000, 3 * one) or abs(three - 3 * one) <= 3


def test_without_token_counts_rows_stand_in():
    kept = budget.rows_per_evaluation(Rows(10_000, None), Rows(100_000, None), 1, 10)
    assert kept == int(0.05 * 3 * 100_000 / 10)


def test_a_steps_speed_leaves_out_the_validation_inside_it(tmp_path):
    # The recipe times a step from the end of the last one: an evaluation in between would
    # halve this step's tokens/s in the progress line, the summary and the status.
    import json
    import time

    import torch  # noqa: F401  (imported in the recipe process long before its steps)

    from kubetune.trainer.metric_logging.metric_logger import JsonLinesMetricLogger

    logger = JsonLinesMetricLogger(str(tmp_path))
    logger.set_epoch(0)
    time.sleep(0.4)
    logger.note_validation_s(0.2)
    logger.log_dict({"loss": 1.0, "tokens_per_second_per_gpu": 100.0}, step=1)
    time.sleep(0.1)
    logger.log_dict({"loss": 0.9, "tokens_per_second_per_gpu": 100.0}, step=2)
    logger.close()
    first, second = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text()
                     .splitlines()]
    assert 150 < first["tokens_per_second"] < 260  # 0.4 s of which 0.2 s validation
    assert second["tokens_per_second"] == 100.0  # no validation in its interval
