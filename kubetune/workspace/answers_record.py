"""The answers on held-out prompts (``kubetune-answers.json`` in ``output/``): for a few
held-out prompts, the reference answer, the base model's (before the first step) and the
tuned model's (after the last), for the run report.

```json
{"prompts": [{"prompt": "...", "reference": "...", "base": "...", "tuned": "..."}],
 "base_step": 0, "tuned_step": 120}
```

The trainer's rank 0 writes it (``kubetune.trainer.validation.answers``), each time whole
and by rename. The base's answers are written first; the tuned model's are added to them
prompt by prompt, so a resumed run, which does not answer as the base again, keeps the
answers its first start wrote.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from kubetune.atomic_write import write_atomic
from kubetune.workspace import ANSWERS_NAME


@dataclass(frozen=True)
class Answered:
    prompt: str
    reference: str
    base: str | None = None  # None: not answered (yet)
    tuned: str | None = None


@dataclass(frozen=True)
class AnswersRecord:
    prompts: list[Answered] = field(default_factory=list)
    base_step: int | None = None
    tuned_step: int | None = None


def path(output_dir: Path | str) -> Path:
    return Path(output_dir) / ANSWERS_NAME


def read(output_dir: Path | str) -> AnswersRecord | None:
    """The record; None when there is none or it cannot be read."""
    try:
        found = json.loads(path(output_dir).read_text(encoding="utf-8"))
        prompts = [Answered(prompt=str(p["prompt"]), reference=str(p["reference"]),
                            base=_text(p.get("base")), tuned=_text(p.get("tuned")))
                   for p in found["prompts"]]
        return AnswersRecord(prompts=prompts, base_step=_step(found.get("base_step")),
                             tuned_step=_step(found.get("tuned_step")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _step(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[arg-type]


def _write(output_dir: Path | str, record: AnswersRecord) -> Path:
    target = path(output_dir)
    write_atomic(target, json.dumps(asdict(record), ensure_ascii=False, indent=1) + "\n")
    return target


def write_base(output_dir: Path | str, answers: Iterable[Mapping], step: int) -> Path:
    """A new record: the base model's ``answers`` (``{"prompt", "reference", "answer"}``
    each) at ``step``; any earlier record's are gone."""
    return _write(output_dir, AnswersRecord(
        prompts=[Answered(prompt=str(a["prompt"]), reference=str(a["reference"]),
                          base=str(a["answer"])) for a in answers],
        base_step=int(step)))


def write_tuned(output_dir: Path | str, answers: Iterable[Mapping], step: int) -> Path:
    """The tuned model's ``answers`` at ``step`` beside the base's for the same prompts (a
    prompt the base did not answer shows none)."""
    earlier = read(output_dir) or AnswersRecord()
    base = {(p.prompt, p.reference): p.base for p in earlier.prompts}
    prompts = [Answered(prompt=str(a["prompt"]), reference=str(a["reference"]),
                        base=base.get((str(a["prompt"]), str(a["reference"]))),
                        tuned=str(a["answer"])) for a in answers]
    kept = any(p.base is not None for p in prompts)
    return _write(output_dir, AnswersRecord(
        prompts=prompts, base_step=earlier.base_step if kept else None, tuned_step=int(step)))
