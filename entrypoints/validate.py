"""`kubetune validate RUNTIME [TRAINJOB]`: a runtime (and a TrainJob) checked offline,
as `kubetune local --runtime` checks them before any step: the CRD schema, the contract our
steps rely on (`runtime_contract`), and the controller's admission rules on the merge.
Nothing runs and nothing is pulled; every violation is its own `error: validate:` line,
exit 65."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("validate")
@click.argument("runtime_path", metavar="RUNTIME", type=click.Path(path_type=Path))
@click.argument("trainjob_path", metavar="[TRAINJOB]", required=False,
                type=click.Path(path_type=Path))
def validate(runtime_path: Path, trainjob_path: Path | None) -> None:
    """Check a ClusterTrainingRuntime YAML, and a TrainJob YAML for it, offline.

    Reports, one line each (file, replicatedJob, container, field): an unnamed container,
    a trainer container not named node, a trainer job without the
    trainer.kubeflow.org/trainjob-ancestor-step: trainer label, a step without the
    workspace mounted at /workspace, a podFailurePolicy naming no container, an unknown
    KUBETUNE_* variable or a value its step would refuse (KUBETUNE_VAL_FRACTION=0.9); then
    the TrainJob merged as the controller merges it. Every violation at once, sorted by
    file and path. Exit 0 when the files pass, 65 when not.
    """
    from kubetune.entrypoints.step import run_step

    sys.exit(run_step("validate", lambda: check(runtime_path, trainjob_path)))


def check(runtime_path: Path, trainjob_path: Path | None) -> int:
    """0, with one `ok` line, when the files pass; else every violation reported, 65."""
    from kubetune.entrypoints.step_options import settings_check
    from kubetune.tools.local.runtime_contract import ContractError, checked_jobset, report

    try:
        jobset = checked_jobset(runtime_path, trainjob_path, settings_check())
    except ContractError as exc:
        return report(exc, "validate")
    jobs = " -> ".join(j["name"] for j in jobset["spec"]["replicatedJobs"])
    click.echo(f"ok: {runtime_path}" + (f" with {trainjob_path}" if trainjob_path else "")
               + f" ({jobs})")
    return 0
