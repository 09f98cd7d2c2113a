"""Chat templates as transformers renders them, without transformers: ``render`` finds and
renders a tokenizer directory's template; the trainer trains in it and the exporter checks
the template it carries against the run's ids, so both import it from here."""
