"""A conversation as OpenAI's chat format writes it (or ShareGPT's), read in full and
turned into torchtune Messages; a row that cannot train is dropped (``RowDropped``), with
the reason the trainer's drop line counts it under.

What OpenAI's grammar holds and what it becomes:

- ``content``: a string; ``null`` (an assistant turn that only calls tools, an empty
  system turn); a list of parts, whose ``text`` parts are joined (an image or audio part
  drops the row: a text model has nothing to read it with);
- ``tool_calls`` (and the older ``function_call``) on an assistant turn: rendered into
  that turn as text, one JSON object per call, ``{"name": ..., "arguments": {...}}``
  after any text the turn has; it trains like the rest of the answer;
- a ``tool`` (or older ``function``) turn: the tool's result, in the family's tool role
  where its torchtune tokenizer has one (Llama 3's ``ipython`` header, Qwen2.5's
  ``<tool_response>`` in a user turn, ChatML's ``tool`` turn for Qwen2); elsewhere a
  user turn holding ``<tool_response>\\n{result}\\n</tool_response>`` (consecutive results
  in one turn);
- ``name``, ``tool_call_id``, ``refusal`` and other keys are read and not rendered
  (torchtune's Message has no place for them); ``weight: 0`` on an assistant turn (OpenAI's
  fine-tuning format) leaves that turn untrained;
- ``developer`` is a system turn; a system turn with no text is no turn.

The order torchtune's ``validate_messages`` asks for is kept (system first, a user turn
before the first answer, no two user or two assistant turns in a row), with tool results
allowed after the assistant turn that called them: a row out of that order is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class RowDropped(ValueError):
    """A row that cannot train; its message is the reason, phrased to follow "rows with"."""


# torchtune tokenizer class -> the role its tokenize_messages renders a tool result in.
TOOL_ROLES = {"Llama3Tokenizer": "ipython", "Qwen2_5Tokenizer": "ipython",
              "Qwen2Tokenizer": "tool"}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
          "tool": "tool", "function": "tool", "ipython": "tool"}
# ShareGPT speakers, torchtune's three and the tool ones LLaMA-Factory's exports use.
_SPEAKERS = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
             "assistant": "assistant", "function_call": "assistant", "observation": "tool",
             "tool": "tool", "function": "tool"}
_TEXT_PARTS = ("text", "input_text", "output_text")


@dataclass
class Turn:
    role: str  # system, user, assistant or tool
    text: str
    calls: bool = False  # an assistant turn that calls tools
    untrained: bool = False  # weight 0: never trained on
    prompt: bool = False  # part of a TRL prompt: trained on only with train_on_input
    absent: bool = False  # a system turn whose content is null: no turn at all


def tool_role(tokenizer: Any) -> str | None:
    """The role ``tokenizer`` renders a tool result in; None: it has none."""
    for cls in type(tokenizer).__mro__:
        if cls.__name__ in TOOL_ROLES:
            return TOOL_ROLES[cls.__name__]
    return None


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (int, float)) and not isinstance(content, bool):
        return str(content)
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        raise RowDropped(f"message content that is a {type(content).__name__}, not text")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") in _TEXT_PARTS:
            texts.append(str(part.get("text") or ""))
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise RowDropped(f"a content part of type {kind!r} (a text model reads text "
                             "parts only)")
    return "".join(texts)


def _calls(message: dict) -> str:
    """An assistant turn's tool calls as text: one JSON object per call."""
    calls = message.get("tool_calls") or []
    if message.get("function_call"):
        calls = [*calls, {"function": message["function_call"]}]
    lines = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not function.get("name"):
            raise RowDropped("a tool call without a function name")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass  # kept as the string the data holds
        lines.append(json.dumps({"name": function["name"], "arguments": arguments},
                                ensure_ascii=False))
    return "\n".join(lines)


def openai_turn(message: Any) -> Turn:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RowDropped("a message without a role")
    role = _ROLES.get(message["role"].strip().lower())
    if role is None:
        raise RowDropped(f"a message from {message['role']!r} (roles: system, user, "
                         "assistant, tool)")
    text = _text(message.get("content"))
    calls = _calls(message) if role == "assistant" else ""
    return Turn(role, "\n".join(t for t in (text, calls) if t), calls=bool(calls),
                untrained=message.get("weight") in (0, 0.0),
                absent=role == "system" and message.get("content") is None)


def sharegpt_turn(message: Any) -> Turn:
    if not isinstance(message, dict) or not isinstance(message.get("from"), str):
        raise RowDropped("a message without a speaker ('from')")
    speaker = message["from"].strip().lower()
    role = _SPEAKERS.get(speaker)
    if role is None:
        raise RowDropped(f"a message from {message['from']!r} (ShareGPT speakers: system, "
                         "human, gpt)")
    return Turn(role, _text(message.get("value")), calls=speaker == "function_call",
                untrained=message.get("weight") in (0, 0.0))


TURN_READERS = {"openai": openai_turn, "sharegpt": sharegpt_turn}


def turns(value: Any, style: str, prompt: bool = False, trl: bool = False) -> list[Turn]:
    """A conversation (a list of messages) as turns; ``prompt``: a TRL prompt, none of whose
    turns trains unless train_on_input. In TRL's rows (``trl``) a string is one turn: a
    prompt's user turn, a completion's answer."""
    if isinstance(value, str) and trl:
        return [Turn("user" if prompt else "assistant", value, prompt=prompt)]
    if isinstance(value, str):
        raise RowDropped("a conversation that is text, not a list of messages")
    if not isinstance(value, list) or not value:
        raise RowDropped(f"an empty or missing {'prompt' if prompt else 'conversation'}")
    read = [TURN_READERS[style](message) for message in value]
    for turn in read:
        turn.prompt = prompt
    return read


def check_order(conversation: list[Turn]) -> None:
    """The order torchtune's validate_messages asks for, tool results allowed where a
    tool was called; a row out of it is dropped."""
    before = None
    for turn in conversation:
        if turn.role == "system":
            if before is not None:
                raise RowDropped("a system turn after the conversation began")
            continue
        if turn.role == "assistant" and before in (None, "system"):
            raise RowDropped("an assistant turn before any user turn")
        if turn.role == "tool" and before not in ("tool", "assistant+calls"):
            raise RowDropped("a tool result without a tool call before it")
        if turn.role == "user" and before == "user":
            raise RowDropped("two user turns in a row")
        if turn.role == "assistant" and before in ("assistant", "assistant+calls"):
            raise RowDropped("two assistant turns in a row")
        before = "assistant+calls" if turn.calls else turn.role
    if not any(turn.role == "assistant" for turn in conversation):
        raise RowDropped("no assistant turn")


@dataclass(frozen=True)
class PlainMessage:
    """What a chat template reads of a torchtune Message (``chat_template_tokens``), for
    the plan's check of sampled rows: the trainer's launcher and `kubetune local` check
    them before any recipe starts and need not import torchtune (seconds) to do it."""

    role: str
    text_content: str
    masked: bool = False


def messages(conversation: list[Turn], tool_role: str | None, train_on_input: bool,
             new_system_prompt: str | None = None, plain: bool = False) -> list[Any]:
    """torchtune Messages (``plain``: PlainMessages, for a chat template): the answers
    trained on (``train_on_input``: every turn)."""
    if plain:
        Message = PlainMessage
    else:
        from torchtune.data import Message
    check_order(conversation)
    out: list[Any] = []
    merged_tool = False  # the last message holds tool results rendered as a user turn
    if new_system_prompt is not None:
        out.append(Message("system", new_system_prompt, masked=True))
    for turn in conversation:
        if turn.role == "system" and (new_system_prompt is not None or turn.absent):
            continue  # replaced, or null: no system turn at all (an empty string is one)
        answer = turn.role == "assistant" and not turn.prompt
        masked = turn.untrained or not (train_on_input or answer)
        if turn.role != "tool":
            out.append(Message(turn.role, turn.text, masked=masked))
        elif tool_role is not None:
            out.append(Message(tool_role, turn.text, masked=masked))
        else:
            wrapped = f"<tool_response>\n{turn.text}\n</tool_response>"
            if merged_tool:
                out[-1] = Message("user", out[-1].text_content + "\n" + wrapped, masked=masked)
            else:
                out.append(Message("user", wrapped, masked=masked))
        merged_tool = turn.role == "tool" and tool_role is None
    return out
