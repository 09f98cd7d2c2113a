"""The recipe process's environment, and the terminal its progress bar draws on."""

from __future__ import annotations

import os
import sys

from kubetune import env
from kubetune.logs import json_mode
from kubetune.redact import SECRET_VARIABLES, without_userinfo
from kubetune.trainer.planning.plan import RunPlan

# Variables that keep every library in the recipe process off the network.
OFFLINE_ENV = {env.HF_HUB_OFFLINE: "1", env.HF_DATASETS_OFFLINE: "1", env.TRANSFORMERS_OFFLINE: "1",
               env.HF_HUB_DISABLE_TELEMETRY: "1", env.DO_NOT_TRACK: "1"}


def child_env(plan_: RunPlan) -> dict[str, str]:
    """What the recipe process(es) start with; ``supervision`` adds its stop file and
    failure directory."""
    # The recipe's environment is ours minus the secrets (what torchrun and the libraries
    # inside read, and passed_env's values, travel through it).
    # The recipe runs offline: it needs no credential, and a URL's user and password
    # (HF_ENDPOINT, ENDPOINT) would sit in its environment for any library to print.
    child = {k: without_userinfo(v) for k, v in os.environ.items() if k not in SECRET_VARIABLES
             and not k.endswith(tuple(f"{s}_FILE" for s in SECRET_VARIABLES))}
    child.update(OFFLINE_ENV)
    child.update(plan_.worker_env())
    child[env.PYTHONUNBUFFERED] = "1"
    # The command carries -P; torchrun starts its workers with `python -m`, which would
    # put the working directory (a clone named `kubetune`, say) first on sys.path.
    child[env.PYTHONSAFEPATH] = "1"
    # torchtune's own bars are off either way: our metric logger draws the one bar (in a
    # terminal, on the fd handed down) or prints a line per step.
    child[env.TQDM_DISABLE] = "1"
    child.pop(env.PROGRESS_TTY, None)
    if terminal() is not None:
        child[env.PROGRESS_TTY] = terminal()
    if plan_.cfg.device == "cpu" and plan_.topology.nproc_per_node > 1 \
            and env.OMP_NUM_THREADS not in child:
        # Share the cores between the processes instead of oversubscribing them.
        child[env.OMP_NUM_THREADS] = str(max(1, (os.cpu_count() or 1)
                                           // plan_.topology.nproc_per_node))
    return child


def terminal() -> str | None:
    """The path of our stdout, when it is a terminal a person watches and lines are not
    asked for (JSON mode). The recipe draws its bar there directly: a bar redraws with
    carriage returns, which the line-by-line redacting pipe would hold back until the epoch
    ends. Only numbers the metric logger computes go that way; everything else still passes
    through redact. A path, not a descriptor: torchrun closes inherited descriptors when it
    starts its workers."""
    try:
        if sys.stdout.isatty() and not json_mode():
            return os.ttyname(sys.stdout.fileno())
    except (AttributeError, ValueError, OSError):
        pass
    return None
