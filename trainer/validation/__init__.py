"""Validation inside the recipe process: the held-out loss (``val_loop``), when it is
measured (``schedule``) and when the run stops early (``early_stop``).

It sits above data, config, checkpointing and metric_logging and below recipe_process,
whose hooks (``kubetune.trainer.recipe_process.held_out``) call it at optimizer-step
boundaries. torchtune 0.6.1's recipes have no validation loop: nothing here changes what
a training step does (the RNG and train modes are forked around it).
"""
