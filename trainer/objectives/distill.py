"""Knowledge distillation: torchtune's KD recipe and base config for a method on a
topology, the teacher a run distils from, and the checks before launch.

torchtune 0.6.1 ships ``knowledge_distillation_single_device`` and
``knowledge_distillation_distributed``, both LoRA students only (they read
``model.lora_rank`` and save merged LoRA weights: a full student has no recipe). DoRA runs:
both initialise the magnitudes after loading the base. QLoRA is refused: neither recipe
registers the NF4 state-dict hooks the SFT recipes have, so its save would hold NF4
tensors no checkpointer writes. The teacher is a frozen full model from
``teacher_checkpointer``; its logits are compared with the student's token by token, so
its vocabulary must be the student's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubetune.errors import BadInputError
from kubetune.trainer.objectives.objective import Fitted, LoggedPart, Objective, checkpoint_named
from kubetune.trainer.performance.memory_plan import ObjectiveLoad
from kubetune.trainer.request.topology import Topology

if TYPE_CHECKING:  # light to import: `kubetune size` checks the method without torch
    from omegaconf import DictConfig

    from kubetune.trainer.checkpointing.checkpoint_model import CheckpointModel

# one process? -> (recipe, base config).
_RECIPES = {
    True: ("knowledge_distillation_single_device", "llama3_2/8B_to_1B_KD_lora_single_device"),
    False: ("knowledge_distillation_distributed", "llama3_2/8B_to_1B_KD_lora_distributed"),
}
RECIPES = tuple(recipe for recipe, _ in _RECIPES.values())
_IMPLIED = {"dora": ["model.use_dora=True"]}
AVAILABLE = "lora or dora, on 1 process or more"
TEACHER_SECTION, TEACHER_MODEL = "teacher_checkpointer", "teacher_model"
# What the KD recipes log beside the loss (the loss is (1 - kd_ratio) * class + kd_ratio * kd):
# the cross-entropy against the labels and the KL divergence from the teacher's logits.
CE_METRIC, KD_METRIC = "class_loss", "kd_loss"


class Distill(Objective):
    name = "distill"
    recipes = RECIPES
    needs_teacher = True
    own_checkpointers = (TEACHER_SECTION,)  # the teacher is another model, never the policy
    # The student's held-out cross-entropy, as SFT's, and the KD term beside it
    # (``validation.distill_held_out``).
    held_out_metrics = "cross_entropy_and_kd"
    logged_parts = (LoggedPart(CE_METRIC, "ce", "ce_loss", 4),
                    LoggedPart(KD_METRIC, "kd", "kd_loss", 4))
    summary_section = "distillation"

    implied = _IMPLIED

    def recipe_table(self, method: str, one_process: bool) -> tuple[str, str]:
        return _RECIPES[one_process]

    def check_method(self, method: str, topology: Topology | None = None,
                     spellings: dict[str, str] | None = None) -> None:
        """Refuse a student method torchtune's KD recipes cannot train."""
        why = {"full": "torchtune's KD recipes train a LoRA student only (no full KD recipe)",
               "qlora": "torchtune's KD recipes do not save an NF4-quantized base"}.get(method)
        if why:
            raise BadInputError(f"distillation with method {method}: {why}; available: "
                                f"{AVAILABLE}")

    def memory_load(self, method: str, teacher_dims: dict | None = None) -> ObjectiveLoad:
        return ObjectiveLoad(teacher_dims=teacher_dims)

    def teacher_overrides(self, teacher_dir: Path) -> list[str]:
        return [f"{TEACHER_SECTION}.checkpoint_dir={teacher_dir}"]

    def fit_models(self, cfg: "DictConfig", student: "CheckpointModel", user_keys: set[str],
                   workspace_teacher: Path) -> Fitted:
        """The teacher: its checkpointer and model sections fitted to the teacher on disk
        (the one named, else the workspace's), its vocabulary the student's."""
        from kubetune.trainer.checkpointing.checkpoint_model import read_checkpoint_model
        from kubetune.trainer.checkpointing.checkpointer_sections import checkpointer_section

        teacher = read_checkpoint_model(teacher_dir(cfg, user_keys, workspace_teacher))
        checkpointer_section(cfg, TEACHER_SECTION, teacher)
        return Fitted(fit_teacher(cfg, student, teacher), teacher)

    def described(self, cfg: "DictConfig") -> dict[str, Any]:
        from omegaconf import OmegaConf

        return {"teacher": checkpoint_named(cfg, TEACHER_SECTION),
                "kd_ratio": OmegaConf.select(cfg, "kd_ratio", default=None),
                "kd_loss": OmegaConf.select(cfg, "kd_loss._component_", default=None)}


OBJECTIVE = Distill()


def teacher_dir(cfg: "DictConfig", user_keys: set[str], default: Path) -> Path:
    """Where the teacher is: the directory the request names for ``teacher_checkpointer``,
    else the workspace's teacher (the teacher initializer's output); refused when neither
    holds a model."""
    named = f"{TEACHER_SECTION}.checkpoint_dir" in user_keys
    where = Path(str(cfg[TEACHER_SECTION].checkpoint_dir)) if named else default
    if not (where / "config.json").is_file():
        how = (f"set {TEACHER_SECTION}.checkpoint_dir to the teacher's model directory"
               if named else "fetch the teacher there (kubetune local --teacher URI, or the "
               "runtime's teacher-initializer) or set teacher_checkpointer.checkpoint_dir "
               "to its model directory")
        raise BadInputError(f"distillation: no teacher model at {where} (no config.json): "
                            f"{how}")
    return where


def fit_teacher(cfg: "DictConfig", student: "CheckpointModel",
                teacher: "CheckpointModel") -> list[str]:
    """The ``teacher_model`` section built for the teacher's checkpoint (a frozen full
    model), after checking that its vocabulary is the student's."""
    from omegaconf import OmegaConf

    check_same_vocabulary(student, teacher)
    arch = teacher.architecture
    old = OmegaConf.select(cfg, f"{TEACHER_MODEL}._component_")
    component = arch.component(False)
    cfg[TEACHER_MODEL] = OmegaConf.create({"_component_": component, **arch.dims})
    return [f"teacher: {teacher.model_dir} ({arch.family}, {arch.summary}) -> {component}"
            + (f" (the config named {old})" if old and old != component else "")]


def check_same_vocabulary(student: CheckpointModel, teacher: CheckpointModel) -> None:
    """KD compares the two models' logits position by position: the same vocabulary size
    and the same token for each id, or the loss is meaningless (or a shape error)."""
    s_vocab = int(student.architecture.dims["vocab_size"])
    t_vocab = int(teacher.architecture.dims["vocab_size"])
    if s_vocab != t_vocab:
        raise BadInputError(f"distillation: the teacher's vocab_size is {t_vocab}, the "
                            f"student's {s_vocab} (config.json): the teacher must share "
                            "the student's tokenizer and vocabulary")
    if _tokens_digest(student.model_dir) != _tokens_digest(teacher.model_dir):
        raise BadInputError(f"distillation: the teacher's tokenizer ({teacher.model_dir}) "
                            f"differs from the student's ({student.model_dir}): KD needs "
                            "one tokenizer (the same token for each id); choose a teacher "
                            "of the student's family")


def _tokens_digest(model_dir: Path) -> str:
    """The tokens a model's tokenizer maps ids to, as a digest: tokenizer.json's
    vocabulary and added tokens (not its formatting or normalizer settings), else the
    sentencepiece/tiktoken model file's bytes."""
    h = hashlib.sha256()
    path = model_dir / "tokenizer.json"
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        vocab = (data.get("model") or {}).get("vocab") or {}
        if isinstance(vocab, list):  # unigram: [piece, score] pairs
            vocab = {str(piece[0]): i for i, piece in enumerate(vocab)}
        added = sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens", []))
        h.update(json.dumps([sorted(vocab.items()), added]).encode())
        return h.hexdigest()
    for name in ("tokenizer.model", "original/tokenizer.model"):
        if (model_dir / name).is_file():
            h.update((model_dir / name).read_bytes())
            return h.hexdigest()
    return ""
