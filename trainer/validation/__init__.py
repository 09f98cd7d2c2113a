"""Held-out data, measured: the held-out set, the validation loss from the base model to the
last step, and answers a person can read.

- ``held_out_set``: which held-out set a run has (the data's validation or test split, a
  fraction held out by content, or the user's own ``dataset_val``), planned before the run;
- ``schedule``: at which optimizer steps validation runs (before the first, every
  ``run_val_every_n_steps``, each epoch's last, after the last);
- ``budget``: how many held-out rows each evaluation measures (about 5% of the run's
  compute at the default frequency);
- ``val_loop``: the validation loss on every rank together, the RNG and train mode untouched;
- ``preference_held_out``: a DPO run's held-out pairs through the recipe's own forward and
  loss: DPO loss, reward accuracy, margin, chosen and rejected rewards;
- ``distill_held_out``: a distillation run's held-out KD term beside the student's
  cross-entropy;
- ``early_stop``: a run stopped after evaluations without improvement;
- ``answers``: greedy answers to a few held-out prompts, the base's and the tuned model's,
  recorded beside the reference (``kubetune.workspace.answers_record``) for the run report.

A layer above ``data``, ``config``, ``checkpointing`` and ``metric_logging``, below
``planning`` and ``recipe_process`` (which calls it at the step boundaries).
"""
