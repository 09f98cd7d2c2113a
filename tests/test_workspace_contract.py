from pathlib import Path

from kubetune.workspace import Workspace


def test_defaults_are_under_slash_workspace():
    ws = Workspace.from_env({})
    assert ws.dataset_dir == Path("/workspace/dataset")
    assert ws.model_dir == Path("/workspace/model")
    assert ws.output_dir == Path("/workspace/output")
    assert ws.export_dir == Path("/workspace/export")


def test_root_moves_as_a_whole_and_single_dirs_move_alone():
    ws = Workspace.from_env({"KUBETUNE_WORKSPACE": "/tmp/pvc", "KUBETUNE_MODEL_DIR": "/models/x"})
    assert ws.dataset_dir == Path("/tmp/pvc/dataset")
    assert ws.output_dir == Path("/tmp/pvc/output")
    assert ws.model_dir == Path("/models/x")
