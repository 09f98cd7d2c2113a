"""A few training samples as the trainer fed them to the model (``kubetune-samples.json``
in ``output/``): each conversation's messages and the token ids torchtune's tokenizer made
of them, with that tokenizer's special tokens.

The exporter checks the export's chat template against them: a template that renders a
conversation to other ids than these prompts the model in a format it was not trained on.
They come from the run itself (the recipe process records them as it tokenizes) rather
than from tokenizing the dataset again at export: the exporter's image has no dataset
stack, and only the run knows what its tokenizer, prompt template and data transforms
really produced. The file carries the run's fingerprint: samples of another run (an
earlier config in the same ``output/``) are never checked against this run's export.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kubetune.workspace import TRAINING_SAMPLES_NAME

VERSION = 1


@dataclass(frozen=True)
class TrainingSample:
    messages: list[dict[str, str]]  # {"role", "content"}, as the chat template receives them
    tokens: list[int]  # what the model was fed for them, end tokens included


@dataclass(frozen=True)
class TrainingSamples:
    fingerprint: str
    tokenizer: str  # torchtune's tokenizer class, module-qualified
    prompt_template: str | None  # torchtune's prompt template the tokenizer applied, if any
    bos_token: str | None
    eos_token: str | None
    # The tokens torchtune's tokenizer stops generation at (end of text, end of turn).
    stop_tokens: dict[str, int] = field(default_factory=dict)
    samples: list[TrainingSample] = field(default_factory=list)
    version: int = VERSION
    # The base model's chat template the conversations were rendered in (None: torchtune's
    # format); the export carries it.
    chat_template: str | None = None

    def encode(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


def read_training_samples(output_dir: Path, fingerprint: str | None) -> TrainingSamples | None:
    """The samples the run with ``fingerprint`` recorded; None when it recorded none (a
    text-completion dataset, a run from before they were recorded), the file is
    unreadable, or it belongs to another run."""
    try:
        found = json.loads((Path(output_dir) / TRAINING_SAMPLES_NAME).read_text())
        if found.get("version") != VERSION or found.get("fingerprint") != fingerprint:
            return None
        samples = [TrainingSample(messages=[{"role": str(m["role"]),
                                             "content": str(m["content"])}
                                            for m in s["messages"]],
                                  tokens=[int(t) for t in s["tokens"]])
                   for s in found["samples"]]
        return TrainingSamples(
            fingerprint=found["fingerprint"], tokenizer=str(found["tokenizer"]),
            prompt_template=found.get("prompt_template"), bos_token=found.get("bos_token"),
            eos_token=found.get("eos_token"),
            stop_tokens={str(k): int(v) for k, v in (found.get("stop_tokens") or {}).items()},
            samples=samples, chat_template=found.get("chat_template"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
