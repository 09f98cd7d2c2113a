"""The trainer step: turn a `tune run` request (from Kubeflow Trainer, or from
`kubetune train`) into one fully merged torchtune config and run torchtune's recipe on it.

The rooms, in the order a run goes through them:

- ``request/``: what was asked (the `tune run` command, topology, recipe for the method,
  and what the recipe process is told through its environment, ``passed_env``);
- ``config/``: torchtune's config + overrides, read and checked;
- ``performance/``, ``data/``, ``checkpointing/``, ``metric_logging/``: the machine, the
  dataset, the checkpoint and the reports, each a room of its own;
- ``validation/``: held-out data measured: the held-out set, the validation loss, and
  answers to a few held-out prompts, base and tuned side by side;
- ``objectives/``: what a run optimises beyond imitation (DPO, distillation), the recipe and the data
  builder for it;
- ``planning/``: the request merged (``planning.plan``) with what
  ``checkpointing.checkpoint_model``, ``performance`` and ``data`` say;
- ``launch``: run the recipe process(es), turn SIGTERM into a resumable stop, write the
  summary and the completion marker; its phases are the rooms of ``launcher/`` (the
  child's environment, supervision, the outcome, what a finished run leaves);
- ``failures/``: the failure record a recipe process that fails for a known reason leaves
  for the launcher (kind, one line, exit code), below both;
- ``recipe_process/``: inside the recipe process, around torchtune's own recipe file
  (``checkpointing.checkpoint_store`` saves, ``metric_logging`` reports);
- ``models/`` and ``schedules``: components torchtune's config instantiates by
  ``_component_`` path (stable names: saved configs refer to them).

The rooms are layers (tests/test_import_root.py): a room imports only rooms below it,
lowest first request, failures, performance, config, data, checkpointing, metric_logging,
validation, planning, recipe_process, launcher, launch; ``models/`` and ``schedules``
import none of them.
"""
