"""docs/model-coverage.md and docs/model_coverage.json are generated: regenerated here from
the tests' transformers (the serving venv) through the trainer's own reading of each
config.json, they are what is committed. Each supported type is one the suite measures:
a row of the family table (tests/test_config_families.py) or a torchtune-built family."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.cli import REPO
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)


def test_the_committed_coverage_table_is_the_generated_one(serving_python, tmp_path):  # noqa: F811
    from kubetune.model_family import families
    from kubetune.model_family.architecture import TORCHTUNE_TYPES
    from kubetune.tools.model_coverage import table

    dumped = subprocess.run([str(serving_python), str(REPO / "kubetune/tools/model_coverage/configs.py")],
                            capture_output=True, text=True, timeout=600,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert dumped.returncode == 0, dumped.stderr[-3000:]
    (tmp_path / "configs.json").write_text(dumped.stdout)
    made = subprocess.run([sys.executable, "-m", "kubetune.tools.model_coverage.table",
                           str(tmp_path / "configs.json"), "--docs", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert made.returncode == 0, made.stderr[-3000:]
    for name in (table.JSON, table.MARKDOWN):
        assert (tmp_path / name).read_text() == (REPO / "docs" / name).read_text(), \
            f"docs/{name} is not what kubetune/tools/model_coverage generates: regenerate it"
    types = json.loads((REPO / "docs" / table.JSON).read_text())["types"]
    supported = {t for t, row in types.items() if row["status"] == "supported"}
    assert supported <= set(TORCHTUNE_TYPES) | set(families.model_types())
    # The families the issue named, and the refusals it named, each by its feature.
    assert {"gemma3_text", "olmo2", "olmo3", "granite", "smollm3", "starcoder2",
            "ministral"} <= supported
    for model_type, feature in {"qwen3_moe": "mixture-of-experts", "mixtral": "mixture-of-experts",
                                "gpt_oss": "mixture-of-experts", "deepseek_v3": "mixture-of-experts",
                                "qwen3_next": "mixture-of-experts", "lfm2": "Mamba layers",
                                "qwen3_5_text": "Mamba layers", "bart": "encoder-decoder"}.items():
        assert feature in types[model_type]["reason"], (model_type, types[model_type])
