"""What the launcher runs instead of a recipe script: ``python -m kubetune.trainer.recipe_process.bootstrap
<recipe.py> --config <merged.yaml>`` (directly, or as torchrun's worker).

It loads torchtune's own recipe file as a module, adapts the library around it (gloo on
CPU; step-level stop/save/resume via ``step_guard``; compile and out-of-memory fallbacks
via ``fallbacks``; the dataset tokenized once into the token cache via ``tokenized_data``;
no NaN from a micro-batch with nothing to train on via ``empty_batches``) and then calls
the recipe's own ``recipe_main``. No recipe code is copied: the recipe class is wrapped, not rewritten.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import os
import sys
import time
from pathlib import Path
from types import ModuleType

from omegaconf import OmegaConf

from kubetune import logs
from kubetune.trainer.data.token_cache.settings import CacheSettings
from kubetune.trainer.recipe_process import (cpu_adapt, empty_batches, failure_report,
                                             fallbacks, recipe_noise, run_sanity,
                                             sample_capture, tokenized_data, warmup_cap)
from kubetune.trainer.request import passed_env
from kubetune.trainer.metric_logging import run_report, train_progress
from kubetune.trainer.recipe_process.step_guard import Guard, StopRequested

log = logging.getLogger("trainer")


def load_recipe_module(path: Path) -> ModuleType:
    # A real module (kept in sys.modules) so pickling and torch.compile find its classes.
    spec = importlib.util.spec_from_file_location("kubetune_recipe", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def recipe_class(module: ModuleType) -> type:
    for value in vars(module).values():
        if (inspect.isclass(value) and value.__module__ == module.__name__
                and all(hasattr(value, m) for m in ("setup", "train", "cleanup"))):
            return value
    raise RuntimeError(f"{module.__file__} defines no recipe class (setup/train/cleanup)")


def defines_save(cls: type) -> bool:
    """Whether the recipe saves through its own method (LoRA, full single-device), not
    through torchtune's CheckpointClient (full distributed; the interface's stub)."""
    return any("save_checkpoint" in vars(k) for k in cls.__mro__
               if k.__module__ == cls.__module__)


def install(cls: type, guard: Guard, data: CacheSettings | None = None,
            cap_warmup: bool = False, fingerprint: str = "") -> None:
    if data is not None and hasattr(cls, "_setup_data"):
        cls._setup_data = tokenized_data.wrap_setup_data(cls._setup_data, data)
    empty_batches.install(cls)
    if cap_warmup and hasattr(cls, "_setup_lr_scheduler"):
        # Its step count comes from the data loader, so from the rows the cache kept.
        cls._setup_lr_scheduler = warmup_cap.wrap_setup_lr_scheduler(cls._setup_lr_scheduler)
    if hasattr(cls, "_setup_data"):
        # Outside the cache: its recorder sees the rows the cache tokenizes in this process,
        # and draws the first ones again from the rows the cache was made from
        # (``tokenized_from``) where the tokenizing happened in workers or a mapped entry
        # replaced it.
        cls._setup_data = sample_capture.wrap_setup_data(cls._setup_data, guard.output_dir,
                                                         fingerprint)
    original_setup = cls.setup

    @functools.wraps(original_setup)
    def setup(self, *args, **kwargs):
        result = original_setup(self, *args, **kwargs)
        guard.after_setup(self)
        train_progress.hand_plan_to_logger(self)
        cfg = kwargs.get("cfg", args[0] if args else None)  # recipe_main: setup(cfg=cfg)
        if cfg is not None:
            train_progress.warn_about_warmup(self, cfg)
        return result

    cls.setup = setup

    if defines_save(cls):
        original_save = cls.save_checkpoint

        @functools.wraps(original_save)
        def save_checkpoint(self, epoch: int, *args, **kwargs):
            # Nothing trained, or garbage trained, is never saved (as a result or to resume).
            run_sanity.check_before_save(self, getattr(self, "_model", None))
            checkpointer = getattr(self, "_checkpointer", None)
            original_dir = guard.before_save(checkpointer)
            result = original_save(self, epoch, *args, **kwargs)
            resumable = epoch + 1 < self.total_epochs
            guard.after_save(self, checkpointer, original_dir, self.epochs_run, epoch, resumable)
            _report_progress(guard, resumable)
            return result

        cls.save_checkpoint = save_checkpoint
    else:
        from torchtune.training.checkpointing._checkpoint_client import CheckpointClient

        original_client_save = CheckpointClient.save_checkpoint
        current: dict = {}

        @functools.wraps(original_client_save)
        def client_save(self, model, optimizer, training_progress, epoch, *args, **kwargs):
            run_sanity.check_before_save(current.get("recipe"), model)
            checkpointer = self._get_checkpointer()
            original_dir = guard.before_save(checkpointer)
            result = original_client_save(self, model, optimizer, training_progress, epoch,
                                          *args, **kwargs)
            resumable = epoch + 1 < training_progress.total_epochs
            guard.after_save(current.get("recipe"), checkpointer, original_dir,
                             training_progress.epochs_run, epoch, resumable)
            _report_progress(guard, resumable)
            return result

        CheckpointClient.save_checkpoint = client_save
        inner_setup = cls.setup

        def remember(self, *args, **kwargs):
            current["recipe"] = self
            return inner_setup(self, *args, **kwargs)

        cls.setup = remember


def _report_progress(guard: Guard, resumable: bool) -> None:
    """The run report so far, after a checkpoint a restart may resume from. Not after the
    final one: the launcher writes the finished run's report moments later, and drawing
    the curves twice cost ~1.8 CPU s at the end of every run (matplotlib's import and one
    figure)."""
    if resumable:
        run_report.on_checkpoint(guard.output_dir, guard.rank)


def quiet_progress_bars() -> None:
    """Without a terminal (a pod's log), tqdm's carriage-return bars are noise: the metric
    logger prints progress lines. Recipes pass ``disable=`` themselves, which overrides
    TQDM_DISABLE, so the class they import is replaced before they import it."""
    import tqdm

    original = tqdm.tqdm

    class QuietTqdm(original):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    tqdm.tqdm = QuietTqdm


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe_path, recipe_args = Path(argv[0]), argv[1:]
    config_path = recipe_args[recipe_args.index("--config") + 1]
    cfg = OmegaConf.load(config_path)
    settings = OmegaConf.to_container(cfg.get("kubetune") or OmegaConf.create({}))

    import torch

    if str(cfg.get("device", "")).startswith("cuda") and not torch.cuda.is_available():
        # The launcher probed the driver without torch; torch disagrees.
        record = failure_report.bad_input("no_cuda", f"the config asks for {cfg.device} but "
                                          "torch sees no CUDA device: run with device=cpu or "
                                          "check the GPU driver")
        failure_report.leave(record)
        print(f"error: trainer: {record.message}", file=sys.stderr)
        return record.exit_code
    if passed_env.under_torchrun():
        from kubetune.parent_death import die_with_parent

        die_with_parent()  # torchrun's workers go when torchrun goes
    recipe_noise.quiet()  # before torchtune and torchao are imported
    cpu_adapt.apply()
    _log_to_stderr()
    guard = Guard(settings, str(cfg.output_dir))
    guard.install_signal_handler()
    if passed_env.progress_bars_off():
        quiet_progress_bars()
    module = load_recipe_module(recipe_path)
    cls = recipe_class(module)
    install(cls, guard, tokenized_data.cache_settings(cfg, settings),
            bool(settings.get("cap_warmup")), str(settings.get("fingerprint") or ""))
    fallbacks.install(cls, guard, compile_on=bool(cfg.get("compile")),
                      compile_ours=bool(settings.get("compile_default")))

    # The recipe's `recipe_main` is wrapped by torchtune's config.parse, which reads argv.
    sys.argv = [str(recipe_path), *recipe_args]
    try:
        module.recipe_main()
    except StopRequested as stop:
        _exit_now(stop.exit_code)
    except Exception as failed:
        # A failure the user must fix leaves its record (the launcher's report and exit
        # code), found by type even when wrapped; anything else is reported from stderr.
        reported = failure_report.report(failed)
        if isinstance(reported, run_sanity.RunRefused):
            # Its line is the report; a traceback would only bury it.
            print(f"{type(reported).__name__}: {reported}", file=sys.stderr)
            _exit_now(run_sanity.EXIT_BAD_INPUT)
        raise
    except SystemExit as done:  # torchtune's config.parse ends every recipe with sys.exit
        if passed_env.under_torchrun():
            # A torchrun worker whose recipe finished (checkpoint saved, process group
            # destroyed): interpreter teardown can still abort in c10d/gloo's C++
            # destructors ("terminate called without an active exception"), which turns
            # a finished run into a failed one and leaves the other nodes waiting at
            # torchrun's exit barrier. Nothing is left to tear down that matters.
            _exit_now(done.code if isinstance(done.code, int) else int(done.code is not None))
        raise
    return 0


def _log_to_stderr() -> None:
    """Our own lines from inside the recipe process (checkpoints vouched for, resume
    position), formatted as the launcher's; torchtune's loggers are left as they are."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter("%(asctime)s trainer %(levelname)s %(message)s",
                                  datefmt=logs.TIME_FORMAT)
    formatter.converter = time.gmtime  # UTC, as every line of ours
    handler.setFormatter(formatter)
    log.addHandler(handler)
    log.setLevel(max(logging.INFO, logs.log_level()))
    log.propagate = False


def _exit_now(code: int) -> None:
    """Flush what the launcher reads, then leave without interpreter teardown."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
