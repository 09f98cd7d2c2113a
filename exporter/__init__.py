"""The exporter step: turn the trainer's output into an artifact a serving stack loads.

Flow (``export``): ``training_output`` (the completed checkpoint, never a half-written
one; ``checkpoint_choice``: the run's last, or the saved one with the lowest validation
loss) and ``base_model`` (the base weights on the PVC and how a user names them) ->
``artifact`` (PEFT adapter and/or merged model files, in Hugging Face layout; ``dora``
puts DoRA's magnitudes in Hugging Face's row order; ``adapter_merge`` merges base +
adapter where the checkpoint holds no merged model) plus ``tokenizer_files`` (the base's
tokenizer with the chat template and stop tokens the run trained with: ``chat_format``
checks a template against the run's training samples, rendered as transformers does by
``kubetune.chat_template.render``, torchtune's formats as templates from
``kubetune.chat_template.torchtune_formats``) and
``model_card`` -> ``export_manifest`` (sha256 of every file, sources, config, metrics;
both name what the run was: ``run_identity``) ->
``verify`` (structure) and ``verify_logits`` (base + adapter reproduces the merged model)
-> a ``destination`` (``destination_local``, ``destination_s3``, ``destination_hf``:
staged, committed, read back; a remote one is built first in the local tree
``build_tree`` makes).
"""
