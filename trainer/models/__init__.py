"""Models torchtune 0.6.1 lacks or gets wrong, built on its public modules and
checkpointer: ``decoder`` (one builder for every family row of
``kubetune.model_family.families``, from the checkpoint's config.json), ``decoder_parts``
(the pieces torchtune lacks: RoPE with partial rotary and linear scaling, windowed and
soft-capped attention, q/k norms before RoPE, embedding and logit scales),
``decoder_weights`` (its checkpointer: HF <-> torchtune by the row's weight names, the PEFT
adapter and config), ``qwen_weights`` (Qwen2's checkpointer: the PEFT adapter rows),
``phi3_weights`` (the fused PEFT adapter torchtune does not write) and ``fast_tokenizer``
(a checkpoint's ``tokenizer.json`` where the family's own tokenizer files are absent).
Referenced by ``_component_`` path: these names are stable."""
