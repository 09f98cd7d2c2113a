"""A config's tokenizer section rebuilt for the checkpoint on disk: its own tokenizer's
builder and files, the files and keys the request names kept where they fit it, the
context limit no longer than the checkpoint's."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.trainer.checkpointing.checkpoint_model import SPECIAL_TOKENS_FILE, CheckpointModel
from kubetune.trainer.config.component_params import component_params
from kubetune.trainer.config.validate import check_tokenizer

log = logging.getLogger("trainer")


def _given_tokenizer_fits(given: Path, ours: Path, model_dir: Path) -> bool:
    """Whether a ``tokenizer.path`` the request names replaces the checkpoint's own file.
    A path into the model directory that is not there is a runtime's default for another
    model's layout (the drop-in runtimes send Llama's ``original/tokenizer.model``; a
    Phi-3 or Gemma checkpoint keeps its tokenizer.model at the top); a file elsewhere is
    the user's own tokenizer and wins when it is the kind the checkpoint's reads."""
    if given.name != ours.name:
        return False
    inside = model_dir.resolve() in given.resolve().parents
    return given.is_file() or not inside


# The tokenizer files a request may name, in each builder's spelling (phi4_tokenizer's
# vocab_path / merges_path, the others' path / merges_file): a runtime written for one
# model family names them for its own.
_TOKENIZER_FILES = {"tokenizer file": ("path", "vocab_path"),
                    "merges file": ("merges_file", "merges_path")}


def _tokenizer_files(new_tok: dict, tok_cfg: DictConfig, checkpoint: CheckpointModel,
                     user_keys: set[str]) -> set[str]:
    """Put the tokenizer files the request names into ``new_tok`` where they fit the
    checkpoint's tokenizer, under its builder's key; one line for each one that does
    not. Returns the override keys taken (checked here, not as unknown keys)."""
    taken = set()
    family = checkpoint.architecture.family
    for what, spellings in _TOKENIZER_FILES.items():
        named = [k for k in spellings if f"tokenizer.{k}" in user_keys and tok_cfg.get(k)]
        taken |= {f"tokenizer.{k}" for k in named}
        if not named:
            continue
        given = Path(str(tok_cfg.get(named[0])))
        ours = next((k for k in spellings if k in new_tok), None)
        if ours and _given_tokenizer_fits(given, Path(new_tok[ours]), checkpoint.model_dir):
            new_tok[ours] = str(given)
        elif ours:
            log.info("tokenizer.%s %s does not fit a %s checkpoint: using %s", named[0],
                     given, family, new_tok[ours])
        else:
            log.info("tokenizer.%s %s: a %s checkpoint's tokenizer (%s) reads no %s: left "
                     "out", named[0], given, family, new_tok["_component_"], what)
    return taken


def _tokenizer_overrides(new_tok: dict, tok_cfg: DictConfig, user_keys: set[str],
                         taken: set[str]) -> None:
    """The request's other ``tokenizer.*`` keys act on the rebuilt section: a builder it
    names replaces the checkpoint's (said in one line), and each key it sets is kept; a key
    the builder does not take is refused by ``config_keys.check_rebuilt_sections``."""
    named = {k.split(".", 2)[1] for k in user_keys
             if k.startswith("tokenizer.") and k.count(".") == 1}
    theirs = tok_cfg.get("_component_") if "_component_" in named else None
    if theirs and str(theirs) != new_tok["_component_"]:
        log.info("tokenizer._component_ %s: used instead of the checkpoint's %s (its files "
                 "from the request's tokenizer.* keys)", theirs, new_tok["_component_"])
        new_tok.clear()
        new_tok.update({"_component_": str(theirs), "max_seq_len": tok_cfg.get("max_seq_len")})
        taken = set()  # their builder reads the files they name, as they name them
    done = {"_component_", "max_seq_len"} | {k.split(".", 1)[1] for k in taken}
    params = component_params(new_tok["_component_"])
    takes = None if params is None or params.var_kwargs else set(params.defaults)
    for key in sorted(named - done):
        # A key the builder does not take stays out, for check_rebuilt_sections's line.
        if key in tok_cfg and (takes is None or key in takes):
            new_tok[key] = tok_cfg[key]


def tokenizer_section(cfg: DictConfig, checkpoint: CheckpointModel,
                       user_keys: set[str]) -> set[str]:
    """The checkpoint's tokenizer; returns the override keys it took (see
    ``_tokenizer_files``)."""
    tok_cfg = cfg.get("tokenizer") or OmegaConf.create({})
    tokenizer = checkpoint.tokenizer
    # A base config's own path points at torchtune's download location: only a path the
    # request names can replace the checkpoint's.
    new_tok = {"_component_": tokenizer.component, **tokenizer.args,
               "max_seq_len": tok_cfg.get("max_seq_len")}
    taken = _tokenizer_files(new_tok, tok_cfg, checkpoint, user_keys)
    if tok_cfg.get("prompt_template"):
        new_tok["prompt_template"] = tok_cfg.prompt_template
    _tokenizer_overrides(new_tok, tok_cfg, user_keys, taken)
    if tokenizer.special_tokens and "special_tokens_path" not in new_tok:
        new_tok["special_tokens_path"] = f"{cfg.output_dir}/{SPECIAL_TOKENS_FILE}"
    limit = checkpoint.max_seq_len
    if new_tok["max_seq_len"] is not None and int(new_tok["max_seq_len"]) > limit:
        log.info("tokenizer.max_seq_len %s exceeds the checkpoint's max_position_embeddings: "
                 "using %d", new_tok["max_seq_len"], limit)
        new_tok["max_seq_len"] = limit
    cfg.tokenizer = OmegaConf.create(new_tok)
    check_tokenizer(cfg.tokenizer, {f"{cfg.output_dir}/{SPECIAL_TOKENS_FILE}"})
    return taken
