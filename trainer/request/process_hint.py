"""How the user asks for more trainer processes, for a refusal's hint: on a pod (and a
`tune run` drop-in) the torch plugin's ``PET_NPROC_PER_NODE`` (a TrainJob's
``numProcPerNode``), under the built-in `kubetune local` its ``--nproc`` (which the request
carries as this key's spelling), so that the hint works on the path the user is on."""

from __future__ import annotations

from kubetune import env
from kubetune.trainer.request.spelling import Spelling

# The spelling key that names how processes per node are set (``TuneRunRequest.spellings``).
PROCESSES_KEY = "nproc_per_node"


def more_processes(spellings: dict[str, str] | None, count: int = 2) -> str:
    """``PET_NPROC_PER_NODE=2``, or ``--nproc 2`` where the request was `kubetune local`'s."""
    setting = (spellings or {}).get(PROCESSES_KEY, env.PET_NPROC_PER_NODE)
    return Spelling(PROCESSES_KEY, setting).assign(str(count))
