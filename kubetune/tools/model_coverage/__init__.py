"""The model coverage table: every causal-LM ``model_type`` the tests' transformers
registers, each supported (built by our decoder or torchtune's, its logits measured against
transformers in the suite) or refused with the line the trainer prints, naming the feature
that stops it. ``configs.py`` runs in a Python with transformers and writes each type's
default config.json; ``table.py`` reads them through ``architecture_of`` (the trainer's own
check) and writes docs/model-coverage.md and docs/model_coverage.json."""
