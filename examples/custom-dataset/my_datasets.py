"""A custom torchtune dataset builder, used through `dataset._component_`.

    tune run lora_finetune_single_device --config llama3_2/1B_lora_single_device \
        dataset._component_=my_datasets.arithmetic_chat_dataset ...

with this directory on PYTHONPATH (in a pod: a ConfigMap mounted at /opt/custom and
PYTHONPATH=/opt/custom in the trainer env, or an image built FROM ours that copies it).

kubetune's launcher points the dataset at the dataset initializer's files: it passes
``source`` (the file format: parquet, json, csv ...) and ``data_files`` to the builder,
so a builder takes both and hands them to torchtune's SFTDataset. It receives no other
setting it does not name (docs/extending.md): this one takes no ``packed``, so packing
asked for is refused before the run, in one line.
"""

from __future__ import annotations

from typing import Any, Mapping

from torchtune.data import Message
from torchtune.datasets import SFTDataset
from torchtune.modules.transforms import Transform


class ArithmeticToChat(Transform):
    """A row {"input": "12+34", "output": "46"} -> a user question and the answer."""

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        return {"messages": [
            Message(role="user", content=f"What is {sample['input']}?", masked=True),
            Message(role="assistant", content=str(sample["output"])),
        ]}


def arithmetic_chat_dataset(tokenizer, source: str = "parquet", data_files=None,
                            split: str = "train", **load_dataset_kwargs) -> SFTDataset:
    """Chat-formatted arithmetic questions from local files."""
    dataset = SFTDataset(source=source, data_files=data_files, split=split,
                         message_transform=ArithmeticToChat(), model_transform=tokenizer,
                         **load_dataset_kwargs)
    # Shows in the trainer's log that this builder, not a built-in one, made the data.
    print(f"arithmetic_chat_dataset: {len(dataset)} conversations from {data_files}")
    return dataset
