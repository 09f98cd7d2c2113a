"""What a conversation looks like in each style torchtune's ``chat_dataset`` reads: a list
of messages, OpenAI's ``{"role", "content"}`` or ShareGPT's ``{"from", "value"}``, as
torchtune's ``OpenAIToMessages`` and ``ShareGPTToMessages`` read them."""

from __future__ import annotations

# Style -> the keys of each of its messages (speaker, text).
MESSAGE_KEYS = {"openai": ("role", "content"), "sharegpt": ("from", "value")}
# ShareGPTToMessages maps these speakers and fails on any other ("KeyError: 'user'").
SHAREGPT_SPEAKERS = ("system", "human", "gpt")


def style_of(value: object) -> str | None:
    """The style of one conversation, from its first message's keys; None where
    ``value`` is not a list of messages."""
    if not isinstance(value, list) or not value or not isinstance(value[0], dict):
        return None
    return next((style for style, keys in MESSAGE_KEYS.items()
                 if all(k in value[0] for k in keys)), None)


def problem(value: object, style: str) -> str | None:
    """Why ``value`` is not a conversation in ``style`` (the chat transform would fail on
    it inside the recipe), or None."""
    speaker, text = MESSAGE_KEYS[style]
    if not isinstance(value, list) or not value:
        return f"{str(value)[:60]!r} is not a list of messages"
    for number, message in enumerate(value, 1):
        if not isinstance(message, dict) or speaker not in message or text not in message:
            return (f"message {number} {str(message)[:60]!r} is not "
                    f"{{{speaker!r}: ..., {text!r}: ...}} ({style} style)")
        if style == "sharegpt" and message[speaker] not in SHAREGPT_SPEAKERS:
            return (f"message {number} is from {message[speaker]!r}; ShareGPT's speakers "
                    f"are {', '.join(SHAREGPT_SPEAKERS)}")
    return None
