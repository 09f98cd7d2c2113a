"""The launcher's rooms, which ``kubetune.trainer.launch`` goes through in order for one
run of the recipe process(es):

- ``previous_run``: another run's output in the output_dir (a fresh run's, neither resumed
  nor complete): "a new run: …" naming what changed, and that output moved aside whole;
- ``child_env``: the recipe's environment (ours less the secrets, offline, the plan's
  worker variables) and the terminal its progress bar draws on;
- ``supervision``: start the recipe, stream its output through redact, turn SIGTERM into a
  stop at the next step (a kill when the grace period runs out), and collect the failure
  record a failing process left (``kubetune.trainer.failures``);
- ``outcome``: how it ended, as a typed error: stopped (resumable or not), a failure
  record's line and exit code, killed by a signal, or the recipe's own error line;
- ``finish``: ``summary.json`` and the run report however it ended; for a completed run
  the adapter configs named, the epoch directory chosen and the completion marker, last;
- ``run_objective``: what the run was for ``summary.json`` (objective, method, recipe,
  loss, a DPO run's reference, a distillation run's teacher), which the exporter names.
"""
