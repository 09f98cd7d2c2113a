"""Chat templates shaped like each family's instruct model's (written from their
structure: no hub), with the special tokens the tiny tokenizers of
``tiny_tokenizers`` carry. ``FAMILY_TEMPLATES``: family -> (tokenizer kind, template,
named tokens for tokenizer_config.json, end-of-turn token)."""

from __future__ import annotations

# Llama 3.x Instruct: bos, a header per message, content trimmed, <|eot_id|>.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")

# Qwen2.5 Instruct (no tools): its default system prompt where the conversation has none.
QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

# Qwen3: the last answer after the last user turn carries a (here empty) thinking block,
# earlier answers none.
QWEN3 = (
    "{%- set ns2 = namespace(q=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}"
    "{%- set ns2.q = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- if loop.index0 > ns2.q and loop.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + message.content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

# Mistral v0.3 Instruct: the system prompt joins the last user turn.
MISTRAL = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}"
    "{%- endif %}{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('After the optional system message, conversation roles must "
    "alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.last and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported') }}"
    "{%- endif %}{%- endfor %}")

# Gemma Instruct: no system role; model turns.
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")

# Phi-3 mini Instruct: <|system|>, <|user|>, <|assistant|> turns ended by <|end|>.
PHI3 = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")

# Phi-4: <|im_start|>role<|im_sep|>content<|im_end|>.
PHI4 = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}")

# family -> (tiny tokenizer kind, template, named tokens, end of turn)
FAMILY_TEMPLATES = {
    "llama3": ("llama3", LLAMA3, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
               "<|eot_id|>"),
    "qwen2.5": ("qwen2", QWEN25, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
                "<|im_end|>"),
    "qwen3": ("qwen3", QWEN3, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
              "<|im_end|>"),
    "mistral": ("spm", MISTRAL, {"bos_token": "<s>", "eos_token": "</s>"}, "</s>"),
    "gemma": ("spm", GEMMA, {"bos_token": "<bos>", "eos_token": "<eos>"}, "<end_of_turn>"),
    "gemma2": ("spm", GEMMA, {"bos_token": "<bos>", "eos_token": "<eos>"}, "<end_of_turn>"),
    "phi3": ("phi3", PHI3, {"eos_token": "<|endoftext|>"}, "<|end|>"),
    "phi4": ("phi4", PHI4, {"eos_token": "<|im_end|>"}, "<|im_end|>"),
}
