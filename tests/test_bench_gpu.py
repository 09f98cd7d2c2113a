"""bench/gpu.sh, the GPU measurement run the moment a GPU is lent (issue 55), cannot rot
between lent machines: its --cpu-smoke mode runs every case on the tiny models, and each
row must hold its numbers (the real-model case, which needs real checkpoints on a GPU, a
reason instead)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO, clean_env
from tests.test_export_serving import serving_python  # noqa: F401 (the fixture)

TRAINED = ("lora-1b", "full-1b", "qlora-1b", "lora-8b", "dpo", "distill")
# The cases bench/gpu_peft.py runs transformers + PEFT's same run of (issue 64).
BASELINED = ("lora-1b", "dpo")


def _gpu_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "bench" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_targets_scale_with_the_cards_bf16_peak(tmp_path, monkeypatch):
    # nvidia-smi as an A100 80GB answers: 312 of an H100's 989 TFLOP/s
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA A100-SXM4-80GB, 81920'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    card = _gpu_bench().card_info(smoke=False)
    assert card["name"] == "NVIDIA A100-SXM4-80GB" and card["memory_gib"] == 80.0
    assert round(card["scale"], 3) == round(312 / 989, 3)


def test_a_gpu_row_meets_its_target_only_within_the_cards_memory_and_the_size_estimate():
    gpu = _gpu_bench()
    card = {"name": "NVIDIA H200", "memory_gib": 140.0, "peak_text": "989 TFLOP/s",
            "scale": 1.0, "device": "cuda"}
    case = next(c for c in gpu.CASES if c.name == "lora-1b")

    def judged(**numbers):
        row = gpu.Row("lora-1b", **{"measured": 61_000.0, "plain": 9_000.0, "ratio": 6.78,
                                    "target": 60_000.0, "peak_gib": 40.0, "size_gib": 42.0,
                                    **numbers})
        gpu.judge(row, case, card)
        return row

    assert judged().met
    assert not judged(measured=59_000.0).met
    assert not judged(peak_gib=127.0, size_gib=127.0).met  # over 90% of the card
    assert not judged(size_gib=44.5).met  # kubetune size 11% over the peak
    # issue 64: at least 1.3x transformers + PEFT's tokens/s, and no more memory than it
    assert judged(peft=40_000.0, peft_ratio=1.525, peft_memory_ratio=0.8).met
    assert not judged(peft=50_000.0, peft_ratio=1.22, peft_memory_ratio=0.8).met
    assert not judged(peft=40_000.0, peft_ratio=1.525, peft_memory_ratio=1.1).met
    dpo = next(c for c in gpu.CASES if c.name == "dpo")  # no tokens/s target of its own
    row = gpu.Row("dpo", measured=9_000.0, peft=8_000.0, peft_ratio=1.125,
                  peft_memory_ratio=0.9)
    gpu.judge(row, dpo, card)
    assert row.met is False
    from gpu_table import markdown  # bench/ is on sys.path once gpu.py is loaded

    text = markdown([judged(), judged(size_gib=44.5)], card, 300.0, 500.0)
    assert "| lora-1b | 61,000 tokens/s | ≥ 60,000 | yes | 6.78x of 9,000 tokens/s | — " \
           "| 40.0 GiB (29% of the card) | 42.0 GiB (+5% of the peak) |" in text
    with_peft = judged(peft=40_000.0, peft_ratio=1.525, peft_memory_ratio=0.8)
    assert "| 6.78x of 9,000 tokens/s | 1.52x of 40,000 tokens/s; memory 0.80x | " \
           in markdown([with_peft], card, 300.0, 500.0)
    failed = judged(peft_note="transformers + PEFT timed out: stopped after its cap of 90 s")
    assert "| transformers + PEFT timed out: stopped after its cap of 90 s |" \
           in markdown([failed], card, 300.0, 500.0)
    assert "| NO |" in text and "+11% of the peak" in text


@pytest.mark.slow
def test_cpu_smoke_fills_every_row_of_the_table(tmp_path, serving_python):
    # 15 training processes (each case's plain and ours, the held-out run twice), one at a
    # time, two steps each (bench/gpu.py's SMOKE_STEPS): most of their CPU is torch and
    # torchtune imported in each (2 steps for 3 took 9% off the cases' CPU seconds).
    env = clean_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("OUT", None)
    done = subprocess.run(["bash", "bench/gpu.sh", "--cpu-smoke", "--workdir",
                           str(tmp_path / "work"), "--out", str(tmp_path / "out"),
                           "--baseline-python", str(serving_python)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "gpu.json").read_text())
    rows = {row["case"]: row for row in result["rows"]}
    assert list(rows) == [*TRAINED[:4], "validation", *TRAINED[4:], "real-model"]
    for case in TRAINED:
        row = rows[case]
        assert row["note"] == "", (case, row["note"])
        # ours and plain torchtune both trained, on the same batches, and `kubetune size`
        # answered for the same run
        assert row["measured"] > 0 and row["plain"] > 0 and row["ratio"] > 0, case
        assert row["raw"]["same_batches"], case
        assert row["size_gib"] is not None and row["size_gib"] >= 0, case  # GiB, 0.1 steps
    # transformers + PEFT trained the same model on the same kind of rows, in the serving
    # venv's own Python (peft never imported beside torchao), and both ratios are there
    for case in BASELINED:
        row = rows[case]
        assert row["peft"] > 0 and row["peft_ratio"] > 0 and row["peft_memory_ratio"] > 0, row
        peft = row["raw"]["peft"]
        assert peft["device"] == "cpu" and peft["steps"] == 2 and min(peft["tokens_per_step"]) > 0
        assert peft["versions"]["peft"] and peft["versions"]["torch"].startswith("2.13")
        assert all(loss == loss and loss > 0 for loss in peft["losses"]), peft  # finite
    assert rows["lora-1b"]["peft_note"] == ""
    assert rows["dpo"]["peft_note"].startswith("TRL not carried")
    assert rows["dpo"]["raw"]["peft"]["losses"][0] == pytest.approx(0.6931, abs=1e-3)  # ln 2
    assert all(rows[case]["peft"] is None for case in rows if case not in BASELINED)
    # the held-out set was evaluated during the run; its share of 6 tiny steps is noise
    # (a few hundred ms either way), so only a share is asked for, not its size
    validation = rows["validation"]
    assert validation["raw"]["rows"] == 24 and validation["raw"]["evaluations"][0] >= 2
    assert -1 < validation["measured"] < 1, validation
    # DPO and distillation repeat on a GPU; one repeat each here
    assert rows["dpo"]["raw"]["repeats"] == rows["distill"]["raw"]["repeats"] == 1
    assert rows["real-model"]["note"].startswith("skipped: "), rows["real-model"]
    assert rows["real-model"]["measured"] is None
    # the table, printed last and written beside the JSON, has a line per case
    table = (tmp_path / "out" / "gpu.md").read_text()
    assert table.strip() in done.stdout
    for case in rows:
        assert f"| {case} |" in table
    assert "| real-model | — |" in table and "skipped: " in table
    assert "| ours / transformers + PEFT |" in table
