"""``dataset.features`` as a config writes it: ``datasets.load_dataset`` wants a
``Features``, which a YAML config cannot hold (it fails on a dict: "'dict' object has no
attribute 'arrow_schema'"). The dict a config holds, in ``Features.to_dict``'s form
(``{"answer": {"dtype": "string", "_type": "Value"}}``), is made one here, in the recipe
process, for every builder that loads through ``datasets``. The plan writes such a dict
to read a CSV's columns as text (``kubetune.trainer.data.csv_text``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping


def apply() -> None:
    """Wrap ``datasets.load.load_dataset_builder`` (what ``load_dataset`` calls) once."""
    import datasets.load as load
    from datasets import Features

    original = load.load_dataset_builder
    if getattr(original, "kubetune_features", False):
        return

    @functools.wraps(original)
    def load_dataset_builder(*args, features=None, **kwargs):
        if isinstance(features, Mapping) and not isinstance(features, Features):
            features = Features.from_dict(dict(features))
        return original(*args, features=features, **kwargs)

    load_dataset_builder.kubetune_features = True
    load.load_dataset_builder = load_dataset_builder
