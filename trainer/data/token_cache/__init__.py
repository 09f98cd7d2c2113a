"""The dataset tokenized once, in parallel, and kept on the volume for every process, every
restart and the next run of the same data (docs/trainer.md, "Tokenized once").

``key`` (what the tokens depend on -> the entry's name), ``build`` (the rows tokenized by
a pool of forked workers, rows with nothing to train on dropped, cut rows counted),
``dropped`` (the rows left out, by reason with their first row numbers, and its line),
``rows`` (the entry's files: flat token and label arrays, their offsets, the record
written last; mapped read-only), ``store`` (the cache directory: one builder under a lock,
staging and rename, fallbacks when the volume cannot hold it, old entries removed),
``packs`` (torchtune's packing from the rows' lengths; each pack made on demand),
``datasets`` (what the recipe reads: rows or packs from the arrays), ``adopt`` (a
builder's dataset swapped for the cached one) and ``settings`` (what it is configured with).
"""
