"""The exporter step: turn the trainer's output into an artifact a serving stack loads.

Flow: ``training_output`` (the completed checkpoint, never a half-written one) ->
``artifact`` (PEFT adapter and/or merged model files, in Hugging Face layout) ->
``verify`` (structure and hashes) -> ``destination`` (staged, then committed).
"""
