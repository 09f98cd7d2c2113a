"""How many processes, on how many nodes, meeting where: from torchrun options in the
command, else the ``PET_*`` variables Kubeflow Trainer's torch plugin sets.

Upstream's `tune run` leaves these to torchrun, which reads ``PET_*`` itself; we resolve
them here so the recipe choice, the validation and the dry run see the same numbers the
run will use. ``auto`` processes per node means one per GPU; without GPUs it means one
process (torchrun would start one per CPU core, each fighting the others for the same
cores, and every process holds a whole model copy).
"""

from __future__ import annotations

from dataclasses import dataclass

from kubetune import env
from kubetune.errors import BadInputError
from kubetune.trainer.performance import hardware
from kubetune.trainer.request.settings import LauncherSettings
from kubetune.trainer.request.tune_command import TuneRunRequest

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Topology:
    nnodes: int
    nproc_per_node: int
    node_rank: int
    rdzv_endpoint: str | None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def kind(self) -> str:
        if self.nnodes > 1:
            return "multi-node"
        return "multi-device" if self.nproc_per_node > 1 else "single-device"

    @property
    def needs_torchrun(self) -> bool:
        """More than one process: torchrun starts them and they meet at its rendezvous.
        One process needs neither, and torchrun would cost a process importing torch
        (about 1.5 CPU s and 200 MB) before the recipe's own start."""
        return self.world_size > 1

    def one_process_env(self) -> dict[str, str]:
        """The environment torchrun gives the only worker of a one-process group, for the
        launcher to start it directly. Port 0: the worker's own store takes a free port
        (nobody else has to reach it), so no port is picked here and raced for."""
        return {env.RANK: "0", env.LOCAL_RANK: "0", env.WORLD_SIZE: "1",
                env.LOCAL_WORLD_SIZE: "1", env.MASTER_ADDR: "127.0.0.1", env.MASTER_PORT: "0"}

    def torchrun_args(self) -> list[str]:
        args = [f"--nnodes={self.nnodes}", f"--nproc_per_node={self.nproc_per_node}"]
        if self.nnodes == 1:
            # One node needs no rendezvous service (nor the DNS name of its own pod).
            return args + ["--standalone"]
        return args + [f"--node_rank={self.node_rank}", "--rdzv_backend=static",
                       f"--rdzv_endpoint={self.rdzv_endpoint}"]


def _int(value: str, what: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise BadInputError(f"{what}={value!r} is not a whole number") from None
    if number < 0:
        raise BadInputError(f"{what}={value} must not be negative")
    return number


def devices_per_node(device: str) -> int:
    if device.startswith("cuda"):
        return max(1, hardware.cuda_device_count())
    return 1


def resolve(request: TuneRunRequest | None, device: str,
            settings: LauncherSettings | None = None) -> Topology:
    """The topology of ``request``'s torchrun options, else ``PET_*`` (``request`` None:
    a run given no torchrun options, as `kubetune train`)."""
    settings = settings or LauncherSettings()

    def option(name: str) -> str | None:
        return request.torchrun_option(name) if request is not None else None

    def pick(name: str, variable: str, default: str) -> tuple[str, str]:
        """The value and where it came from (the option or the variable, named in an
        error: a PET_* value is the torch plugin's, not the command's)."""
        if option(name):
            return option(name), name
        if settings.pet(variable):
            return settings.pet(variable), variable
        return default, name.lstrip("-")

    nnodes = _int(*pick("--nnodes", env.PET_NNODES, "1"))
    nproc_raw, nproc_from = pick("--nproc_per_node", env.PET_NPROC_PER_NODE, "auto")
    nproc = devices_per_node(device) if nproc_raw in ("auto", "gpu") else \
        _int(nproc_raw, nproc_from)
    node_rank, rank_from = pick("--node_rank", env.PET_NODE_RANK, "0")
    node_rank = _int(node_rank, rank_from)
    if nnodes < 1 or nproc < 1:
        raise BadInputError(f"nnodes={nnodes} and nproc_per_node={nproc} must be at least 1")
    if node_rank >= nnodes:
        raise BadInputError(f"{rank_from}={node_rank} is not below nnodes {nnodes}")
    endpoint = option("--rdzv_endpoint")
    if endpoint is None and settings.pet(env.PET_MASTER_ADDR):
        port = settings.pet(env.PET_MASTER_PORT) or str(DEFAULT_PORT)
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise BadInputError(f"{env.PET_MASTER_PORT}={port!r} is not a port (1 to 65535)")
        endpoint = f"{settings.pet(env.PET_MASTER_ADDR)}:{port}"
    if nnodes > 1 and not endpoint:
        raise BadInputError(f"{nnodes} nodes need a rendezvous endpoint: pass "
                            f"--rdzv_endpoint=host:port or set {env.PET_MASTER_ADDR}")
    if endpoint and ":" not in endpoint:
        endpoint = f"{endpoint}:{DEFAULT_PORT}"
    return Topology(nnodes=nnodes, nproc_per_node=nproc, node_rank=node_rank,
                    rdzv_endpoint=endpoint)
