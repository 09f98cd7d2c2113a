"""Each input a user can get wrong fails before launch: one actionable line on stderr and
in the termination log, exit 65, and no completion marker where the exporter looks."""

from __future__ import annotations

import shutil

import pytest

from kubetune.errors import EXIT_BAD_INPUT
from tests.support.cli import error_lines
from tests.support.trainer import make_pvc, tune_run

pytestmark = pytest.mark.slow

LORA = ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device"]


def dataset_args(pvc) -> list[str]:
    return ["dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
            f"dataset.data_dir={pvc.dataset / 'data'}"]


def assert_one_line_error(result, pvc, *fragments: str) -> None:
    assert result.returncode == EXIT_BAD_INPUT, result.stderr[-2000:]
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0]
    assert pvc.termination_log.read_text().strip() == lines[0].removeprefix("error: ")
    assert not pvc.complete()
    assert "Traceback" not in result.stderr


@pytest.fixture
def pvc(tmp_path, tiny_model_dir, tiny_dataset_dir):
    return make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)


def test_qlora_on_shapes_nf4_cannot_quantize(pvc):
    result = tune_run(pvc, *LORA, *pvc.runtime_args(), *dataset_args(pvc),
                      "model.quantize_base=True")
    assert_one_line_error(result, pvc, "QLoRA cannot quantize this model",
                          "q_proj 64x64", "use method lora")


def test_qlora_on_several_nodes(pvc):
    env = pvc.env(PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_NODE_RANK="0")
    result = tune_run(pvc, "--rdzv_endpoint=127.0.0.1:29555", "lora_finetune_distributed",
                      "--config", "llama3_2/1B_lora", *pvc.runtime_args(), *dataset_args(pvc),
                      "model.quantize_base=True", env=env)
    assert_one_line_error(result, pvc, "QLoRA cannot run on several nodes")


def test_single_device_recipe_on_several_nodes(pvc):
    env = pvc.env(PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_NODE_RANK="0")
    result = tune_run(pvc, "--rdzv_endpoint=127.0.0.1:29556", *LORA, *pvc.runtime_args(),
                      *dataset_args(pvc), env=env)
    assert_one_line_error(result, pvc, "runs on one device but 2 nodes",
                          "lora_finetune_distributed")


def test_missing_tokenizer(tmp_path, model_copy, tiny_dataset_dir):
    shutil.rmtree(model_copy / "original")
    (model_copy / "tokenizer.json").unlink()  # with it, the checkpoint trains on it
    pvc = make_pvc(tmp_path / "pvc2", model_copy, tiny_dataset_dir)
    result = tune_run(pvc, *LORA, *pvc.runtime_args(), *dataset_args(pvc))
    assert_one_line_error(result, pvc, "original/tokenizer.model is missing",
                          "or a Hugging Face tokenizer.json")


def test_unreadable_tokenizer(tmp_path, model_copy, tiny_dataset_dir):
    (model_copy / "original" / "tokenizer.model").write_text("<html>not a tokenizer</html>\n")
    pvc = make_pvc(tmp_path / "pvc2", model_copy, tiny_dataset_dir)
    result = tune_run(pvc, *LORA, *pvc.runtime_args(), *dataset_args(pvc))
    assert_one_line_error(result, pvc, "is not a tiktoken BPE file")


def test_column_map_names_a_missing_column(pvc):
    result = tune_run(pvc, *LORA, *pvc.runtime_args(), *dataset_args(pvc),
                      "dataset.column_map={'input': 'question', 'output': 'answer'}")
    assert_one_line_error(result, pvc, "has no column 'question' (dataset.column_map maps "
                          "input to it)", "its columns are input, output",
                          "set dataset.column_map={'input': '<column>', 'output': 'answer'}")


def test_output_dir_not_writable(pvc, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = [a for a in pvc.runtime_args() if not a.startswith("output_dir=")]
    result = tune_run(pvc, *LORA, f"output_dir={blocker / 'output'}", *args,
                      *dataset_args(pvc))
    assert_one_line_error(result, pvc, "is not writable", "output_dir")


def test_output_dir_a_symlink_to_nothing_names_the_link(pvc, tmp_path):
    link = tmp_path / "output-link"
    link.symlink_to(tmp_path / "unmounted-volume")
    args = [a for a in pvc.runtime_args() if not a.startswith("output_dir=")]
    result = tune_run(pvc, *LORA, f"output_dir={link}", *args, *dataset_args(pvc))
    assert_one_line_error(result, pvc, f"output_dir {link} is a symlink to",
                          "which does not exist")
    assert link.is_symlink() and not (tmp_path / "unmounted-volume").exists()


def test_hub_dataset_name_fails_fast_instead_of_downloading(tmp_path, tiny_model_dir):
    pvc = make_pvc(tmp_path / "pvc2", tiny_model_dir, None)
    (pvc.root / "dataset").mkdir()  # an empty dataset volume: the initializer did not run
    result = tune_run(pvc, *LORA, *pvc.runtime_args(), "dataset.source=tatsu-lab/alpaca")
    assert_one_line_error(result, pvc, "the trainer does not download",
                          "run the dataset initializer")
