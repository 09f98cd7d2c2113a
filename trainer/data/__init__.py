"""The dataset as the recipe will read it: local files win over a config's hub ``source``
(``dataset_location``; every path's files named by split as ``datasets`` names them,
``split_files``, so that only ``dataset.split`` is trained on), the training split's
columns and lengths checked before launch (``dataset_check``, counting rows and sampling
them per format with ``dataset_rows``; ``column_map`` the user's map and hints in the
syntax they set it in; ``conversations`` what a chat message holds; ``step_count``: do the
rows make an optimizer step), the builder for the data's shape where the user named none
(``dataset_shape``; ``csv_text`` a CSV's columns read as text), the chat builder
(``chat_dataset``: OpenAI's and ShareGPT's rows in full and TRL's prompt-completion, made
into torchtune messages by ``chat_messages``, a row that cannot train dropped with its
reason; in the base model's own chat template by ``chat_template_tokens``), and, inside the recipe process, the rows tokenized once into a cache
on the volume (``token_cache``: rows with nothing to train on dropped, packs made as
torchtune makes them), the samples the tokenizer cuts to the context counted on the way
(``truncation``) and batches padded to whole output chunks where FSDP shards the output
apart (``whole_chunks``); rows held out by a hash of their content (``held_out_rows``: the
same rows on every rank and resume, never trained on); the rows read, dropped by reason,
held out and kept (``row_counts``), a dropped row named by its file and row number
(``row_origin``)."""
