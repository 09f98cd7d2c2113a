"""What a run tells people and programs: torchtune's metric logger writing JSON lines
(``metric_logger``), one progress line per step and the TrainJob status (``train_progress``),
``summary.json`` (``summary``), and the run report with its curves (``run_report``, drawn by
``curves`` with matplotlib). The held-out losses: their progress line (``validation_progress``),
their numbers for the summary and the launcher's last line (``validation_numbers``), and the
report's section (``validation_report``); an objective's own held-out numbers (a DPO run's
rewards, a distillation run's KD term) at the base, best and last (``held_out_numbers``)."""
