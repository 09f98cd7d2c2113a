"""The exporter's name for the shared renderer (``kubetune.chat_template.render``)."""

from kubetune.chat_template.render import *  # noqa: F401,F403
from kubetune.chat_template.render import (NAMED_TOKENS, TEMPLATE_FILE, TOKENIZER_CONFIG,  # noqa: F401
                                           TOKENIZER_JSON, FoundTemplate, TextTokenizer,
                                           find_template, named_tokens, render)
