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
    """``--nproc 2`` where the request was the built-in `kubetune local`'s, else the
    TrainJob's field and the variable the torch plugin turns it into."""
    setting = (spellings or {}).get(PROCESSES_KEY)
    if setting is not None:
        return Spelling(PROCESSES_KEY, setting).assign(str(count))
    return f"a TrainJob's numProcPerNode: {count}, {env.PET_NPROC_PER_NODE}={count}"
