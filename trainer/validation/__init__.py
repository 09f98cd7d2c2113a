"""Held-out data and what is measured on it.

- ``heldout_set``: which held-out set a run gets, planned before launch: the data's own
  validation (else test) split, a fraction of the training split held out by content
  (``kubetune.trainer.data.holdout``), or the user's own ``dataset_val``; written into the
  merged config (``dataset_val``, ``run_val_every_n_steps``, ``kubetune.validation``,
  ``kubetune.holdout``) with the rows each side has.

Above ``data`` and ``config``, below ``recipe_process``.
"""
