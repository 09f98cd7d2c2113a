"""Held-out data and what is measured on it.

- ``heldout_set``: which held-out set a run gets, planned before launch: the data's own
  validation (else test) split, a fraction of the training split held out by content
  (``kubetune.trainer.data.holdout``), or the user's own ``dataset_val``; written into the
  merged config (``dataset_val``, ``run_val_every_n_steps``, ``kubetune.validation``,
  ``kubetune.holdout``) with the rows each side has.
- Inside the recipe process: the held-out loss (``val_loop``), when it is measured
  (``schedule``) and when the run stops early (``early_stop``). torchtune 0.6.1's recipes
  have no validation loop; the hooks (``kubetune.trainer.recipe_process.held_out``) call
  these at optimizer-step boundaries, and nothing here changes what a training step does
  (the RNG and train modes are forked around it).

Above ``data``, ``config``, ``checkpointing`` and ``metric_logging``; below ``recipe_process``.
"""
