"""Run inside the serving venv (transformers + peft, no kubetune): one process answering
requests, one JSON object a line on stdin, one report a line on stdout, until stdin ends,
so that a batch of checks pays transformers' imports once (tests/support/serving_session.py
starts it and sends them):

  {"op": "write-many", "specs": [[FAMILY, DIR, VOCAB_SIZE, SHAPE], ...]}  -> {}
  {"op": "logits-many", "tokens": [[...]], "dirs": [DIR, ...]}          -> {DIR: logits}
  {"op": "load", "base": DIR, "export": DIR}   -> load_adapter.report's (an adapter with
                                                  PEFT onto its base, merged weights alone)

A request that raises answers {"error": its traceback}; the next one is still served.
Anything a library prints goes to stderr.
"""

import json
import sys
import traceback
from pathlib import Path

import hf_checkpoint  # beside this file: the script's directory is on sys.path
import load_adapter


def answer(request: dict) -> dict:
    op = request["op"]
    if op == "write-many":
        for family, out, vocab, shape in request["specs"]:
            hf_checkpoint.write(family, Path(out), int(vocab), shape)
        return {}
    if op == "logits-many":
        return {d: hf_checkpoint.model_logits(Path(d), request["tokens"])
                for d in request["dirs"]}
    if op == "load":
        return load_adapter.report(Path(request["base"]), Path(request["export"]))
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    out, sys.stdout = sys.stdout, sys.stderr
    for line in iter(sys.stdin.readline, ""):
        try:
            result = answer(json.loads(line))
        except Exception:
            result = {"error": traceback.format_exc()[-3000:]}
        out.write(json.dumps(result) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
