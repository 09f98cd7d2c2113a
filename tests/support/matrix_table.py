"""docs/runtimes.md's support-matrix table, rendered from what the matrix's runs recorded
(docs/support-matrix.json, written by `make matrix-results`), so the docs claim no cell
the suite does not run. tests/test_support_matrix.py checks the doc holds this rendering.

Usage: python -m tests.support.matrix_table   (rewrites the table in docs/runtimes.md)
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.support_matrix import (BYO, CHAT_TEMPLATE, GANG, METHOD_NAMES, METHODS,
                                          MODEL, MODELS, OBJECTIVES, TOPOLOGIES, Cell)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "support-matrix.json"
DOC = REPO / "docs" / "runtimes.md"
BEGIN = ("<!-- support matrix: rendered from docs/support-matrix.json by "
         "tests/support/matrix_table.py; do not edit by hand -->")
END = "<!-- end of support matrix -->"
SHORT = {"1 process": "1p", "2 processes": "2p", "2 nodes": "2n"}
RUNTIME_MARK = {BYO: "byo", GANG: "gang"}


def load(path: Path = RESULTS) -> dict[str, dict]:
    return json.loads(path.read_text())["cells"]


class _Notes:
    """Footnotes numbered in order of first use, one per distinct text."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def ref(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"


def _cell_text(cell: Cell, result: dict, own_runtime: str, notes: _Notes) -> str:
    outcome = result["outcome"]
    if outcome == "covered":
        model, _, topology = result["by"].split(" | ")[:3]
        return f"= {SHORT[topology] if model == cell.model else model} " \
               f"{notes.ref(result['why'])}"
    if outcome == "unsupported":
        return f"65 {notes.ref('`' + result['line'] + '`')}"
    if outcome != "passed":
        return f"**{outcome}**"
    runtime = result["runtime"]
    return "✓" if runtime == own_runtime else f"✓ {RUNTIME_MARK.get(runtime, runtime)}"


def _chat_text(model: str) -> str:
    family, proof = CHAT_TEMPLATE[model]
    return f"base's ✓ {proof}" if proof else f"torchtune's {family} format"


def render(results: dict[str, dict]) -> str:
    """The markdown between BEGIN and END."""
    notes = _Notes()
    columns = [(m, t) for m in METHODS for t in TOPOLOGIES]
    head = "| model, its runtime | " + " | ".join(
        f"{METHOD_NAMES[m]} {SHORT[t]}" for m, t in columns) + " | chat template |"
    lines = [head, "|" + "---|" * (len(columns) + 2)]
    for model in MODELS:
        cells = [_cell_text(c, results[c.key], model.runtime, notes)
                 for c in (Cell(model.name, m, t) for m, t in columns)]
        lines.append(f"| **{model.name}**: {model.shape}<br>`{model.runtime}` | "
                     + " | ".join(cells) + f" | {_chat_text(model.name)} |")
    # The objective axis: a row per objective beyond SFT and family that carries it.
    for key, objective in OBJECTIVES.items():
        for name in objective.models:
            runtime = objective.runtime or MODEL[name].runtime
            why = notes.ref(objective.why)  # numbered before its cells' notes
            cells = [_cell_text(c, results[c.key], runtime, notes)
                     if m in objective.methods else "—"
                     for m, t in columns for c in [Cell(name, m, t, key)]]
            lines.append(f"| **{name}, {objective.name}** {why}<br>`{runtime}` | "
                         + " | ".join(cells) + " | as SFT's row |")
    legend = ("1p: one process; 2p: two processes on one node; 2n: two nodes of one "
              "process each. ✓: trained 2 steps through `kubetune local --runtime` on the "
              "model's runtime, exported, and loaded by transformers / PEFT with finite "
              "logits that moved from the base model's; ✓ byo / ✓ gang: the same on "
              f"`{BYO}` (the model's own runtime does not admit the cell) / `{GANG}`. "
              "65: refused with exit 65 and this one line before any step. "
              "= X: not run; covered by cell X, for the reason noted. Chat template: chat "
              "data (system prompts, several turns) trains in the base's own template and the "
              "export carries it (✓ run: the family's tiny checkpoint with its instruct "
              "template trained, and transformers' apply_chat_template on the merged export "
              "renders the training ids and stops generation at the template's end of turn; "
              "docs/trainer.md). A row **model, DPO**: the objective axis, the same cells "
              "trained with `--objective dpo` on preference pairs; a DPO run measures its "
              "test split's pairs (DPO loss, reward accuracy and margins, base to end), "
              "its export is loaded as an SFT run's. A row **model, Distillation**: the same "
              "cells trained with `--objective distill` on the distillation runtime, the "
              "teacher fetched by its third initializer (a TrainJob's runtimePatch names it), "
              "the held-out loss the student's, its export loaded as an SFT run's. —: a "
              "method the objective's row has no cell for.")
    footnotes = [f"{i}. {text}" for i, text in enumerate(notes.texts, 1)]
    return "\n".join([BEGIN, "", *lines, "", legend, "", *footnotes, "", END])


def rewrite(doc: str, block: str) -> str:
    """``doc`` with its support-matrix block replaced by ``block``."""
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    return doc[:start] + block + doc[end:]


def rendered_block(doc: str) -> str:
    return doc[doc.index(BEGIN):doc.index(END) + len(END)]


if __name__ == "__main__":
    DOC.write_text(rewrite(DOC.read_text(), render(load())))
