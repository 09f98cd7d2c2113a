"""The exporter step: turn the trainer's output into an artifact a serving stack loads.

Flow (``export.py``): ``training_output`` (the completed checkpoint, never a half-written
one) -> ``artifact`` (PEFT adapter and/or merged model files, in Hugging Face layout,
plus ``model_card``) -> ``manifest`` (sha256 of every file, sources, config, metrics) ->
``verify`` (structure) and ``verify_logits`` (base + adapter reproduces the merged
model) -> a ``destination`` (local, S3 or hub: staged, committed, read back).
"""
