"""Torchtune's distributed recipes on CPU with gloo: 2 processes on one node, and 2 nodes
(two launchers, as two pods) meeting on 127.0.0.1."""

from __future__ import annotations

import socket

import pytest

from tests.support.trainer import SHORT, make_pvc, start_tune_run, tune_run

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dataset_args(pvc) -> list[str]:
    return ["dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
            f"dataset.data_dir={pvc.dataset / 'data'}", "epochs=1", *SHORT]


def test_two_processes_lora_distributed_on_cpu(tmp_path, tiny_model_dir, tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    env = pvc.env(PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_NODE_RANK="0")
    # As the controller composes it for 2 processes: a rendezvous endpoint, the
    # distributed LoRA recipe, the multi-device config.
    result = tune_run(pvc, f"--rdzv_endpoint=127.0.0.1:{free_port()}",
                      "lora_finetune_distributed", "--config", "llama3_2/1B_lora",
                      *pvc.runtime_args(), "model.lora_attn_modules=[q_proj,v_proj]",
                      *dataset_args(pvc), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = pvc.summary()
    assert summary["world_size"] == 2 and summary["steps"] == 3
    assert pvc.complete()
    assert (pvc.output / "epoch_0" / "adapter_model.safetensors").is_file()
    # A pod's log gets progress lines, not carriage-return bars (the recipe forces rank
    # 0's bar on; the bootstrap turns it off without a terminal).
    assert "it/s]" not in result.stderr
    assert "train: step 1 | epoch 0 | loss" in result.stdout


def test_two_nodes_full_finetune_on_loopback(tmp_path, tiny_model_dir, tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    port = free_port()
    args = [f"--rdzv_endpoint=127.0.0.1:{port}", "full_finetune_distributed", "--config",
            "llama3_3/70B_full_multinode", *pvc.runtime_args(), *dataset_args(pvc)]
    nodes = [start_tune_run(pvc, *args, log=tmp_path / f"node{rank}.log",
                            env=pvc.env(PET_NNODES="2", PET_NPROC_PER_NODE="1",
                                        PET_NODE_RANK=str(rank)))
             for rank in (1, 0)]
    codes = [node.wait(timeout=600) for node in nodes]
    logs = "\n".join((tmp_path / f"node{r}.log").read_text() for r in (0, 1))
    assert codes == [0, 0], logs[-3000:]
    summary = pvc.summary()
    assert summary["world_size"] == 2 and summary["steps"] == 3
    assert pvc.complete()
    assert list((pvc.output / "epoch_0").glob("model-*.safetensors"))
