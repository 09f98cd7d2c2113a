"""The exporter's name for torchtune's formats as chat templates
(``kubetune.chat_template.torchtune_formats``)."""

from kubetune.chat_template.torchtune_formats import known_tokenizers, trained_template  # noqa: F401
