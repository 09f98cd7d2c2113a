"""Model families torchtune 0.6.1 lacks or gets wrong, built on its public modules and
checkpointer: ``qwen3`` (builders), ``qwen_weights`` (Qwen2/Qwen3 checkpointers, HF <->
torchtune and the PEFT adapter rows), ``gemma2`` (logit soft-cap and feed-forward norms as
Hugging Face has them) ``phi3_weights`` (the fused PEFT adapter torchtune does not
write) and ``fast_tokenizer`` (a checkpoint's ``tokenizer.json`` where the family's own
tokenizer files are absent). Referenced by ``_component_`` path: these names are stable."""
