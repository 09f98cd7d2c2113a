"""The chat builder the trainer picks for conversations (``dataset_shape``): torchtune's
``chat_dataset`` with every row read as OpenAI or ShareGPT write it
(``kubetune.trainer.data.chat_messages``), and TRL's conversational prompt-completion
rows (a ``prompt`` and a ``completion`` column of messages: the completion trained on).

Rows load as torchtune's ``SFTDataset`` loads them (``datasets.load_dataset``, which reads
a JSON file whose contents mix strings and lists of parts), tokenized by the recipe's
tokenizer. The messages are made and checked here rather than by torchtune's
``validate_messages``, which refuses a tool result before an answer: a row that cannot
train raises ``RowDropped`` when it is tokenized, and the token cache leaves it out and
counts it by reason (``token_cache.build``).

With ``chat_template`` (the base model's own, which the plan passes with
``chat_template_dir``, the directory of its tokenizer files) the conversation is rendered
in it and tokenized by the base's ``tokenizer.json`` (``chat_template_tokens``) instead of
torchtune's format; ``OBSERVERS`` see each conversation so tokenized (the training samples'
recorder).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from kubetune.trainer.data import chat_messages
from kubetune.trainer.data.chat_template_tokens import TemplateTokenizer, as_chat

# Called with (chat, tokens, template) for each conversation tokenized in a chat template.
OBSERVERS: list[Callable] = []


class ChatTransform:
    """A row's conversation (and TRL completion) -> torchtune Messages -> tokens."""

    def __init__(self, tokenizer: Any, column: str, style: str, completion_column: str | None,
                 train_on_input: bool, new_system_prompt: str | None,
                 chat_template: str | None = None, chat_template_dir: str | None = None) -> None:
        if style not in chat_messages.TURN_READERS:
            raise ValueError(f"Unsupported conversation style: {style}")
        self.tokenizer, self.column, self.style = tokenizer, column, style
        self.completion_column = completion_column
        self.train_on_input, self.new_system_prompt = train_on_input, new_system_prompt
        self.tool_role = chat_messages.tool_role(tokenizer)
        self.template = None
        if chat_template:
            self.tool_role = "ipython"  # the template's "tool" role (as_chat)
            self.template = TemplateTokenizer(chat_template, chat_template_dir or ".",
                                              getattr(tokenizer, "max_seq_len", None))

    def messages(self, sample: Mapping[str, Any]) -> list:
        completion = self.completion_column
        trl = completion is not None
        conversation = chat_messages.turns(sample.get(self.column), self.style,
                                           prompt=trl, trl=trl)
        if completion is not None:
            if not sample.get(completion):
                raise chat_messages.RowDropped("an empty or missing completion")
            conversation += chat_messages.turns(sample.get(completion), self.style, trl=True)
        # A chat template reads only roles, texts and masks: no torchtune Message needed
        # (the plan checks sampled rows in processes that never import torchtune).
        return chat_messages.messages(conversation, self.tool_role, self.train_on_input,
                                      self.new_system_prompt, plain=self.template is not None)

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        messages = self.messages(sample)
        if self.template is None:
            return self.tokenizer({"messages": messages})
        tokens, mask = self.template.tokenize(messages)
        for observe in OBSERVERS:
            observe([as_chat(m) for m in messages], tokens, self.template.template)
        return {"tokens": tokens, "mask": mask}


def chat_dataset(tokenizer: Any, *, source: str, conversation_column: str,
                 conversation_style: str, completion_column: str | None = None,
                 train_on_input: bool = False, new_system_prompt: str | None = None,
                 packed: bool = False, filter_fn: Callable | None = None,
                 chat_template: str | None = None, chat_template_dir: str | None = None,
                 split: str = "train", **load_dataset_kwargs: Any):
    """torchtune's ``chat_dataset``'s parameters, plus ``completion_column`` (TRL's
    conversational prompt-completion shape: ``conversation_column`` is the prompt), and
    ``chat_template`` / ``chat_template_dir``: train in the base model's template."""
    # Here, not at the top: the plan imports ChatTransform before any recipe starts.
    from torchtune.datasets import PackedDataset, SFTDataset

    transform = ChatTransform(tokenizer, conversation_column, conversation_style,
                              completion_column, train_on_input, new_system_prompt,
                              chat_template, chat_template_dir)
    # No message_transform: SFTDataset would run validate_messages on its result.
    ds = SFTDataset(source=source, message_transform=None, model_transform=transform,
                    filter_fn=filter_fn, split=split, **load_dataset_kwargs)
    if packed:
        if tokenizer.max_seq_len is None:
            raise ValueError("PackedDataset requires a max_seq_len to be set on the tokenizer.")
        return PackedDataset(ds, max_seq_len=tokenizer.max_seq_len)
    return ds
