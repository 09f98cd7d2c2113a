"""The trainer step: turn a `tune run` request (from Kubeflow Trainer, or from
`kubetune train`) into one fully merged torchtune config and run torchtune's recipe on it.

Flow: ``tune_command`` (parse) -> ``recipe_config`` (base config + overrides) ->
``checkpoint_model`` / ``hardware`` / ``dataset_location`` (corrections from what is
really on disk and in the machine) -> ``launch`` (run, record, mark complete).
"""
