"""The plan of a run, above every room it asks: ``plan`` merges the request with what the
checkpoint (``checkpointing``), the hardware (``performance``), the data (``data``) and an
earlier run (``checkpointing.resume``) say into the one torchtune config that runs, fitting
a config's settings for its own model to the checkpoint (``model_shaped``) and choosing the
chat format conversations train in, checked before the first step (``chat_template_plan``);
``train_plan``
plans `kubetune train`'s options the same way, on the recipe their method needs."""
