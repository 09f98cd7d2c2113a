"""What a conversation looks like in each style the chat builder reads: a list of
messages, OpenAI's ``{"role", "content"}`` or ShareGPT's ``{"from", "value"}``. Checked
here before launch only as far as a whole file of another shape goes; a row's own
problems (a role out of order, an unknown speaker) are the chat builder's to drop and
count (``chat_messages``)."""

from __future__ import annotations

# Style -> the keys of each of its messages (speaker, text).
MESSAGE_KEYS = {"openai": ("role", "content"), "sharegpt": ("from", "value")}


def style_of(value: object) -> str | None:
    """The style of one conversation, from its first message's keys; None where
    ``value`` is not a list of messages."""
    if not isinstance(value, list) or not value or not isinstance(value[0], dict):
        return None
    # By the speaker's key alone: OpenAI's content may be absent (a turn of tool calls).
    return next((style for style, keys in MESSAGE_KEYS.items() if keys[0] in value[0]), None)


def problem(value: object, style: str) -> str | None:
    """Why ``value`` is not a conversation in ``style`` (the chat transform would fail on
    it inside the recipe), or None."""
    speaker, text = MESSAGE_KEYS[style]
    if not isinstance(value, list) or not value:
        return f"{str(value)[:60]!r} is not a list of messages"
    for number, message in enumerate(value, 1):
        if not isinstance(message, dict) or speaker not in message:
            return (f"message {number} {str(message)[:60]!r} is not "
                    f"{{{speaker!r}: ..., {text!r}: ...}} ({style} style)")
    return None
