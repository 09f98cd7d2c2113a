"""What the launcher runs instead of a recipe script: ``python -m kubetune.trainer.recipe_process.bootstrap
<recipe.py> --config <merged.yaml>`` (directly, or as torchrun's worker).

It loads torchtune's own recipe file as a module, adapts the library around it (gloo and
per-document packed attention on CPU via ``cpu_adapt``), wraps the recipe class's
methods (``recipe_hooks``: the data, setup and saves; ``fallbacks``: compile and
out-of-memory) and then calls the recipe's own ``recipe_main``. No recipe code is copied: the recipe class is wrapped, not rewritten.
"""

from __future__ import annotations

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
from kubetune.trainer.recipe_process import (cpu_adapt, dataset_features, failure_report,
                                             fallbacks, recipe_hooks, recipe_noise,
                                             run_sanity, tokenized_data)
from kubetune.trainer.metric_logging import train_progress
from kubetune.trainer.request import passed_env
from kubetune.trainer.recipe_process.step_guard import EarlyStopped, Guard, StopRequested

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
    train_progress.keep_output_off_the_bar()  # before the recipe's loggers are made
    cpu_adapt.apply()
    dataset_features.apply()
    _log_to_stderr()
    guard = Guard(settings, str(cfg.output_dir))
    guard.install_signal_handler()
    if passed_env.progress_bars_off():
        quiet_progress_bars()
    module = load_recipe_module(recipe_path)
    cls = recipe_class(module)
    recipe_hooks.install(cls, guard, tokenized_data.cache_settings(cfg, settings),
                         bool(settings.get("cap_warmup")),
                         str(settings.get("fingerprint") or ""))
    fallbacks.install(cls, guard, compile_on=bool(cfg.get("compile")),
                      compile_ours=bool(settings.get("compile_default")))

    # The recipe's `recipe_main` is wrapped by torchtune's config.parse, which reads argv.
    sys.argv = [str(recipe_path), *recipe_args]
    try:
        module.recipe_main()
    except EarlyStopped as stopped:
        # Its epoch is saved as the final one; the recipe's own end (the metric logger
        # closed: the user's logger ends its run) did not run past the raise.
        stopped.recipe.cleanup()
        _exit_now(0)
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
