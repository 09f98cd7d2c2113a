"""Recipe choice agrees with Kubeflow Trainer's torch plugin (getRecipeAndConfig), and the
topology comes from PET_* as the controller sets them."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from kubetune.trainer.request import methods, topology
from kubetune.trainer.config.recipe_config import apply_overrides
from kubetune.trainer.request.tune_command import TuneRunRequest
from kubetune.trainer.request.settings import LauncherSettings

# (method, nnodes, nproc) -> (recipe, config suffix) as the controller composes them.
CONTROLLER = {
    ("lora", 1, 1): ("lora_finetune_single_device", "_lora_single_device"),
    ("qlora", 1, 1): ("lora_finetune_single_device", "_qlora_single_device"),
    ("full", 1, 1): ("full_finetune_single_device", "_full_single_device"),
    ("lora", 1, 4): ("lora_finetune_distributed", "_lora"),
    ("qlora", 1, 4): ("lora_finetune_distributed", "_qlora"),
    ("full", 1, 4): ("full_finetune_distributed", "_full"),
    ("full", 2, 4): ("full_finetune_distributed", "_full_multinode"),
}


@pytest.mark.parametrize("key", sorted(CONTROLLER))
def test_kubetune_train_picks_the_controllers_recipe(key):
    method, nnodes, nproc = key
    recipe, suffix = CONTROLLER[key]
    topo = topology.Topology(nnodes, nproc, 0, "127.0.0.1:29500" if nnodes > 1 else None)
    chosen_recipe, config, implied = methods.recipe_for(method, topo)
    assert chosen_recipe == recipe
    assert config == methods.VARIANT_TEMPLATES[suffix]
    if method == "qlora" and nproc > 1:
        assert "model.quantize_base=True" in implied


@pytest.mark.parametrize("args, method", [
    (["model.lora_attn_modules=[q_proj,v_proj,output_proj]"], "lora"),
    (["model.lora_attn_modules=[q_proj]", "model.quantize_base=True"], "qlora"),
    (["model.lora_attn_modules=[q_proj]", "model.quantize_base=False"], "lora"),
    # As the controller reads them: DoRA wins over quantize_base.
    (["model.lora_attn_modules=[q_proj]", "model.quantize_base=True", "model.use_dora=True"],
     "dora"),
])
def test_method_read_from_sdk_args_as_the_controller_reads_them(args, method):
    cfg = apply_overrides(OmegaConf.create({"model": {"_component_": "x.lora_llama3_2_1b"}}),
                          args)
    assert methods.method_of(cfg.model, "lora_finetune_single_device") == method


def test_full_recipe_with_lora_args_is_refused():
    with pytest.raises(Exception, match="trains all weights but the arguments ask for lora"):
        methods.check_recipe("full_finetune_distributed", "lora",
                             topology.Topology(2, 1, 0, "h:1"))


def test_topology_from_pet_variables_and_rendezvous_option():
    request = TuneRunRequest("full_finetune_distributed", "c",
                             torchrun_args=["--rdzv_endpoint=job-node-0-0.job:29500"])
    topo = topology.resolve(request, "cpu", LauncherSettings(
        {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "1"}))
    assert (topo.nnodes, topo.nproc_per_node, topo.node_rank) == (2, 1, 1)
    assert "--rdzv_endpoint=job-node-0-0.job:29500" in topo.torchrun_args()
    assert "--node_rank=1" in topo.torchrun_args()


# The args a TrainJob carries for each method, as the SDK writes them.
_METHOD_ARGS = {"lora": ["model.lora_attn_modules=[q_proj,v_proj]"],
                "dora": ["model.lora_attn_modules=[q_proj,v_proj]", "model.use_dora=True"],
                "qlora": ["model.lora_attn_modules=[q_proj,v_proj]", "model.quantize_base=True"],
                "full": []}


@pytest.mark.parametrize("method", sorted(_METHOD_ARGS))
@pytest.mark.parametrize("nproc", [1, 4])
def test_the_emulator_and_kubetune_train_make_one_choice(method, nproc):
    # kubetune local's controller emulator reads the method from a TrainJob's args and asks
    # the trainer's table; kubetune train asks it for the method given: on one node the
    # two agree on the recipe and on the config variant.
    from kubetune.tools.local.runtime_merge import tune_recipe_and_config

    recipe, config = tune_recipe_and_config(1, nproc, nproc, _METHOD_ARGS[method],
                                            "torchtune-llama3.2-1b")
    ours, base, _ = methods.recipe_for(method, topology.Topology(1, nproc, 0, None))
    assert ours == recipe
    assert base == methods.VARIANT_TEMPLATES[config.removeprefix("llama3_2/1B")]
