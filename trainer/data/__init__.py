"""The dataset as the recipe will read it: local files win over a config's hub ``source``
(``dataset_location``), their columns and lengths checked before launch (``dataset_check``,
counting rows and sampling them per format with ``dataset_rows``; ``step_count``: do the
rows make an optimizer step), and, inside the recipe process, the rows tokenized once into
a cache on the volume (``token_cache``: rows with nothing to train on dropped, packs made
as torchtune makes them), the samples the tokenizer cuts to the context counted on the way
(``truncation``)."""
