"""The dataset as the recipe will read it: local files win over a config's hub ``source``
(``dataset_location``), their columns and lengths checked before launch (``dataset_check``,
counting rows and sampling them per format with ``dataset_rows``; ``step_count``: do the
rows make an optimizer step), and, inside the recipe
process, the samples the tokenizer cuts to the context counted (``truncation``) and batches
padded to whole output chunks where FSDP shards the output apart (``whole_chunks``)."""
