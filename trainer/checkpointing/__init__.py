"""Checkpoints in and out: what the initializer's checkpoint really is (``checkpoint_model``:
architecture, weights, tokenizer; ``checkpointer_sections``: a config's checkpointer
sections fitted to it), torchtune's saves made atomic and vouched for
(``checkpoint_store``, inside the recipe process), and the record that says which run a
checkpoint belongs to and how to resume from it (``resume``); what a LoRA run's saves
before its last leave out (``epoch_saves``: the merged model)."""
