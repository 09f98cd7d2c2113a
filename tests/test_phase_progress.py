"""Long phases that are not training steps say how far they are (issue 52 §4): a line every
``INTERVAL_S`` with what is done, of how much, and an estimate of what is left; from a
thread, so one long unit of work is not silent either; nothing for a short phase. Used by
the held-out loss, the held-out answers, checkpoint saves and exports."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import torch

from kubetune import phase_progress
from kubetune.phase_progress import PhaseProgress
from kubetune.trainer.recipe_process import save_progress
from kubetune.trainer.validation import budget, val_loop


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_says_what_is_done_and_estimates_what_is_left():
    clock = Clock()
    progress = PhaseProgress("validation at step 0", 40, "batches", None, clock=clock)
    with progress:
        assert progress.line() == ("validation at step 0: 0/40 batches, 0:00:00 so far, "
                                   "estimating what is left")
        clock.now += 30
        progress.advance(10)
        assert progress.line() == ("validation at step 0: 10/40 batches, 0:00:30 so far, "
                                   "~0:01:30 left")
        progress.advance(30)
        assert progress.line().endswith("0:00:30 so far, finishing")


def test_stages_name_the_one_under_way():
    progress = PhaseProgress("export", 3, "stages done", None, clock=Clock())
    progress.stage("writing the adapter")
    progress.stage("verifying")
    assert progress.line().startswith("export: 1/3 stages done, verifying, ")


def test_lines_come_during_one_long_unit_of_work_and_none_for_a_short_phase():
    lines: list[str] = []
    with PhaseProgress("saving", 2, "files", lines.append, interval_s=0.05) as progress:
        time.sleep(0.3)  # one unit of work longer than the interval
        progress.advance()
    assert len(lines) >= 3 and all(line.startswith("saving: 0/2 files") for line in lines)
    count = len(lines)
    time.sleep(0.15)
    assert len(lines) == count  # the thread ended with the phase
    with PhaseProgress("short", 1, "units", lines.append, interval_s=5):
        pass
    assert len(lines) == count
    assert not [t for t in threading.enumerate() if t.name.startswith("progress-")]


def test_another_rank_writes_nothing():
    with PhaseProgress("validation", 1, "batches", None, interval_s=0.01):
        time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name.startswith("progress-")]


class Decoder(torch.nn.Module):
    """What the loss loop calls: ``model(tokens=...)`` -> logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.output = torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.output(self.embed(tokens))


def test_the_held_out_loss_advances_a_batch_at_a_time():
    torch.manual_seed(0)
    recipe = SimpleNamespace(_model=Decoder(), _device=torch.device("cpu"),
                             _loss_fn=torch.nn.CrossEntropyLoss(),
                             ignore_labels_cache=torch.full((3, 1), -100))
    rows = [{"tokens": [1, 2, 3, 4], "labels": [1, 2, 3, 4]} for _ in range(7)]

    def collate(batch):
        return {"tokens": torch.tensor([r["tokens"] for r in batch]),
                "labels": torch.tensor([r["labels"] for r in batch])}

    progress = PhaseProgress("validation", val_loop.batch_count(7, 3, 1), "batches", None)
    val_loop.held_out_loss(recipe, rows, 3, collate, 0, 1, progress)
    assert progress.done == progress.total == 3
    assert val_loop.batch_count(9, 2, 2) == 3  # 5 rows on each of 2 ranks


def test_a_save_reports_the_bytes_arriving_in_its_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(phase_progress, "INTERVAL_S", 0.05)
    (tmp_path / "earlier.bin").write_bytes(b"x" * 5_000_000)  # already there: not counted
    lines: list[str] = []
    monkeypatch.setattr(save_progress.log, "info", lines.append)
    model = torch.nn.Linear(1000, 1000)  # 4 MB of float32 parameters
    with save_progress.reporting(SimpleNamespace(_output_dir=tmp_path), model, 2, rank=0):
        (tmp_path / "model.safetensors").write_bytes(b"x" * 2_000_000)
        time.sleep(0.2)
    assert lines and lines[-1].startswith("saving the epoch 2 checkpoint: 2/4 MB written")
    assert "left" in lines[-1]
    lines.clear()
    with save_progress.reporting(SimpleNamespace(_output_dir=tmp_path), model, 2, rank=1):
        time.sleep(0.2)
    assert not lines


def test_answers_are_cut_to_their_share_prompts_first_then_new_tokens():
    lengths = [100, 120, 90]
    # Unbounded (the training tokens unknown): as asked.
    assert budget.fit_answers(lengths, 64, 2048, None) == (3, 64)
    cost = budget.answer_cost(lengths, 64, 2048)
    assert cost == 64 * 3 * (120 + 64)
    assert budget.fit_answers(lengths, 64, 2048, cost) == (3, 64)
    assert budget.fit_answers(lengths, 64, 2048, budget.answer_cost(lengths[:2], 64, 2048)) \
        == (2, 64)
    prompts, new = budget.fit_answers(lengths, 64, 2048, 40 * 140)
    assert (prompts, new) == (1, 40) and budget.answer_cost(lengths[:1], 40, 2048) <= 40 * 140
    # Never below one prompt of MIN_NEW_TOKENS, however small the share.
    assert budget.fit_answers(lengths, 64, 2048, 1) == (1, budget.MIN_NEW_TOKENS)
    assert budget.fit_answers(lengths, 8, 2048, 1) == (1, 8)


def test_the_answers_share_is_of_the_run_actually_trained():
    class Cached:
        rows = SimpleNamespace(meta={"tokens": 200_000})

    whole = budget.answer_forward_tokens(Cached(), epochs=2)
    assert whole == budget.ANSWER_SHARE * budget.FORWARD_PER_STEP * 200_000 * 2 / 2
    assert budget.answer_forward_tokens(Cached(), 2, fraction=0.25) == whole / 4
    assert budget.answer_forward_tokens([1, 2, 3], 1) is None  # not cached: tokens unknown
