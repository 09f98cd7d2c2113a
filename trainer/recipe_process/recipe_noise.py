"""Keep the recipe process's known noise out of pod logs (``KUBETUNE_LOG_LEVEL=debug``
keeps it): torchtune's 80-line resolved-config dump (the merged config is already
``output_dir/kubetune-config.yaml``), its profiler chatter, torchao's import warnings
(``kubetune.logs.quiet_libraries``, shared with every step), and library deprecation
warnings a user cannot act on. torchtune's own lines below the user's level go too
(``-q``: its INFO chatter; its warnings and errors stay).

Applied in the recipe process before torchtune is imported, so each source is silenced
where it speaks; anything not listed here still reaches the log.
"""

from __future__ import annotations

import logging
import warnings

from kubetune import logs

# torchtune's messages (logger torchtune.utils._logging) that say nothing a user needs.
TORCHTUNE_NOISE = (
    "with resolved config:",  # config.log_config's dump of the whole config
    "Profiling disabled",
    "Profiler config after instantiation",
)
# Python warnings from libraries, by message start.
WARNING_NOISE = (
    "'set_vital' is deprecated",  # torchdata's StatefulDataLoader
    # torch's C++ TORCH_WARN on a bf16 CPU: an fp32 activation meets a bf16 weight inside
    # torchtune's mixed modules; torch casts, and nothing in a config changes it.
    "Mismatch dtype between input and weight",
)


class _DropNoise(logging.Filter):
    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        # torchtune's recipes set their logger to DEBUG each time they fetch it, so the
        # user's level (`-q`: warnings and errors only) is applied here, per record.
        if record.levelno < self.level:
            return False
        message = record.getMessage()
        return not any(fragment in message for fragment in TORCHTUNE_NOISE)


def quiet() -> None:
    if logs.debug_mode():
        return
    logging.getLogger("torchtune.utils._logging").addFilter(_DropNoise(logs.log_level()))
    logs.quiet_libraries()  # torchao's import warnings, as in every step's process
    for message in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=message)
