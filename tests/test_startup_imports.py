"""What the launcher and the recipe process import before the first step: only what
the run needs then. matplotlib draws the run report's curves at a checkpoint or at the
end; imported at start-up it cost each process about a second of CPU and 30 MB of
resident memory before training began (bench/trainer.py, issue 33)."""

from __future__ import annotations

import json
import subprocess
import sys

# The modules each process imports at start: the `tune` launcher (its plan and launch)
# and the recipe process's bootstrap (with everything it wraps around the recipe).
START_UP = ("kubetune.entrypoints.tune", "kubetune.entrypoints.train", "kubetune.trainer.launch",
            "kubetune.trainer.recipe_process.bootstrap")
# Needed only once a figure is drawn.
DEFERRED = ("matplotlib",)


def test_start_up_leaves_matplotlib_for_the_report():
    code = (f"import importlib, json, sys\nfor m in {START_UP!r}: importlib.import_module(m)\n"
            f"print(json.dumps([m for m in {DEFERRED!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_the_curves_still_draw_after_a_lazy_import(tmp_path):
    from kubetune.trainer.metric_logging import curves

    steps = [{"step": s, "loss": 2.0 - s / 10, "lr": 1e-4, "tokens_per_second": 100.0}
             for s in range(1, 6)]
    curves.save(tmp_path / "c.png", steps)
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
