"""The plan of a run, above every room it asks: ``plan`` merges the request with what the
checkpoint (``checkpointing``), the hardware (``performance``), the data (``data``), the
run's objective (``objectives``: resolved once, stored as ``kubetune.objective``) and an
earlier run (``resume_plan``) say into the one torchtune config that runs. Its parts, one
job each: ``config_source`` (the config by name or the user's file, the keys overridden),
``checkpoint_fit`` (the model, scheduler and checkpointer sections rebuilt for the
checkpoint, the keys checked), ``tokenizer_section`` (the checkpoint's tokenizer, the
files the request names where they fit), ``model_shaped`` (a config's settings for its
own model: FSDP sharding and offload, tensor parallelism), ``chat_template_plan`` (the
chat format conversations train in, checked before the first step), ``our_sections``
(our metric logger and the ``kubetune`` section the recipe process reads),
``resume_plan`` (the fingerprint, and the earlier run to resume), ``settings_line`` (the
one line before step 1 naming the LoRA settings and the dtype, each with why); ``train_plan`` plans
`kubetune train`'s options the same way, on the recipe their objective and method need."""
