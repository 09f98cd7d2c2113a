"""torchtune's conversation formats, written as chat templates.

The template of a family renders a conversation to exactly what that family's torchtune
tokenizer made of it for training: the same headers and turn ends, content trimmed where
torchtune trims it, and the end-of-text token torchtune appends after the last message.
With ``add_generation_prompt`` it renders the conversation so far and the assistant's
header instead of that token: the prefix the model was trained to answer. The exporter
never trusts this file alone: every template is checked on the run's own samples
(``chat_format``) before it is written.

Only the tokenizers whose format needs no prompt template are here (torchtune's default
for Llama-3 and Qwen); a run with a ``tokenizer.prompt_template`` has none.
"""

from __future__ import annotations

# A message's text as the trainer made it (``kubetune.trainer.data.chat_messages``): a
# string, or a list of parts whose text parts are joined; an assistant's ``tool_calls``
# after it, one {"name", "arguments"} JSON object a call (arguments as a dict, as
# transformers passes them). A system message whose content is null is no message.
_TEXT = (
    "{% set ns = namespace(text='') %}"
    "{% if message['content'] is string %}{% set ns.text = message['content'] %}"
    "{% elif message['content'] is iterable %}{% for part in message['content'] %}"
    "{% if part['type'] in ['text', 'input_text', 'output_text'] %}"
    "{% set ns.text = ns.text + part['text'] %}{% endif %}{% endfor %}{% endif %}"
    "{% if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{% for call in message['tool_calls'] %}"
    "{% set f = call['function'] if call['function'] is defined else call %}"
    "{% set ns.text = ns.text + ('\\n' if ns.text else '') "
    "+ ({'name': f['name'], 'arguments': f['arguments']} | tojson) %}"
    "{% endfor %}{% endif %}"
)
_FOR_MESSAGES = ("{% for message in messages %}"
                 "{% if not (message['role'] == 'system' and message['content'] is none) %}"
                 + _TEXT)
_END_FOR = "{% endif %}{% endfor %}"

# Llama3Tokenizer: a header per message (role stripped), content stripped, <|eot_id|>. A
# tool result ("tool", OpenAI's role) is torchtune's ipython message: Llama 3's ipython header.
_LLAMA3 = (
    "{{ BOS }}"
    + _FOR_MESSAGES +
    "{% set role = 'ipython' if message['role'] == 'tool' else message['role'] | trim %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' "
    "+ ns.text | trim + '<|eot_id|>' }}"
    + _END_FOR +
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% else %}{{ EOS }}{% endif %}"
)

# Qwen2Tokenizer (ChatML, a tool result in a "tool" turn): the last message, when the
# assistant's, is not closed by <|im_end|>\n; the end-of-text token (<|im_end|> by default)
# ends it.
_CHATML = (
    _FOR_MESSAGES +
    "{{ '<|im_start|>' + message['role'] + '\\n' + ns.text }}"
    "{% if not (loop.last and message['role'] == 'assistant') %}{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    + _END_FOR +
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% else %}{{ EOS }}{% endif %}"
)

# Qwen2_5Tokenizer: ChatML, and a tool result (torchtune's ipython message) inside a user
# turn as <tool_response>...</tool_response>, consecutive results in one turn.
_QWEN2_5 = (
    _FOR_MESSAGES +
    "{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' }}"
    "{% else %}{{ '\\n<tool_response>\\n' }}{% endif %}"
    "{{ ns.text + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + ns.text }}"
    "{% if not (loop.last and message['role'] == 'assistant') %}{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endif %}"
    + _END_FOR +
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% else %}{{ EOS }}{% endif %}"
)

_BY_TOKENIZER = {
    "torchtune.models.llama3._tokenizer.Llama3Tokenizer": _LLAMA3,
    "torchtune.models.qwen2._tokenizer.Qwen2Tokenizer": _CHATML,
    "torchtune.models.qwen2_5._tokenizer.Qwen2_5Tokenizer": _QWEN2_5,
}


def _quoted(token: str) -> str:
    return "'" + token.replace("\\", "\\\\").replace("'", "\\'") + "'"


def trained_template(tokenizer: str, prompt_template: str | None, bos_token: str | None,
                     eos_token: str | None) -> str | None:
    """The template of torchtune's ``tokenizer`` class (module-qualified), with its bos and
    eos tokens; None where torchtune's format is not one of these."""
    template = _BY_TOKENIZER.get(tokenizer)
    if template is None or prompt_template is not None or eos_token is None:
        return None
    if "BOS" in template:
        if bos_token is None:
            return None
        template = template.replace("BOS", _quoted(bos_token))
    return template.replace("EOS", _quoted(eos_token))


def known_tokenizers() -> list[str]:
    return [name.rsplit(".", 1)[-1] for name in _BY_TOKENIZER]
