"""The trainer step: turn a `tune run` request (from Kubeflow Trainer, or from
`kubetune train`) into one fully merged torchtune config and run torchtune's recipe on it.

In the launcher process: ``tune_command`` (parse) -> ``plan`` (``recipe_config`` base
config + overrides, corrected by ``checkpoint_model`` / ``hardware`` / ``topology`` /
``methods`` / ``dataset_location`` / ``dataset_check`` / ``validate`` / ``speed`` /
``resume``) -> ``launch`` (run, SIGTERM, ``summary``, completion marker).
In the recipe process(es): ``bootstrap`` (``cpu_adapt``, ``step_guard``) around
torchtune's own recipe file, logging through ``metric_logger``.
"""
