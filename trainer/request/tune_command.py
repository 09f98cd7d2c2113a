"""Parse the command Kubeflow Trainer gives the trainer container.

The controller composes ``tune run [torchrun options] <recipe> --config <config>
key=value ...``; torchrun options come before the recipe, config overrides after.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from kubetune.errors import BadInputError


@functools.lru_cache(maxsize=1)
def torchrun_flags() -> frozenset[str]:
    """torchrun's options that take no value, every spelling, as torchrun's own parser
    declares them: a flag a new torch adds cannot take the recipe's name for its value."""
    from torch.distributed.run import get_args_parser

    return frozenset(spelling for action in get_args_parser()._actions
                     if action.nargs == 0 for spelling in action.option_strings)


@dataclass
class TuneRunRequest:
    recipe: str
    config: str
    overrides: list[str] = field(default_factory=list)
    torchrun_args: list[str] = field(default_factory=list)
    # Config key -> the environment variable or option that set it (`kubetune train`'s),
    # so that a hint names what the user set (``kubetune.trainer.request.spelling``).
    spellings: dict[str, str] = field(default_factory=dict)
    # The objective named (``--objective``, KUBETUNE_OBJECTIVE; None: the recipe's),
    # resolved once by the plan (``kubetune.trainer.objectives.registry.resolve``).
    objective: str | None = None

    def torchrun_option(self, name: str) -> str | None:
        """The value of ``--name`` among the torchrun options (``--a=b`` or ``--a b``)."""
        args = self.torchrun_args
        for i, arg in enumerate(args):
            for spelling in {name, name.replace("_", "-")}:
                if arg == spelling and i + 1 < len(args):
                    return args[i + 1]
                if arg.startswith(spelling + "="):
                    return arg.split("=", 1)[1]
        return None


def parse_tune_run(argv: list[str]) -> TuneRunRequest:
    """Parse the arguments that follow ``tune run``."""
    torchrun_args: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        torchrun_args.append(arg)
        if "=" not in arg and arg not in torchrun_flags():
            if i + 1 >= len(argv):
                raise BadInputError(f"tune run: option {arg} needs a value")
            torchrun_args.append(argv[i + 1])
            i += 1
        i += 1
    if i >= len(argv):
        raise BadInputError("tune run: no recipe given; usage: tune run [TORCHRUN-OPTIONS] "
                            "<recipe> --config <config> [key=value ...]")
    recipe = argv[i]
    rest = argv[i + 1:]
    config = None
    overrides: list[str] = []
    j = 0
    while j < len(rest):
        arg = rest[j]
        if arg == "--config":
            if j + 1 >= len(rest):
                raise BadInputError("tune run: --config needs a value")
            config = rest[j + 1]
            j += 2
            continue
        if arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
        j += 1
    if not config:
        raise BadInputError(f"tune run {recipe}: the --config argument is required")
    return TuneRunRequest(recipe=recipe, config=config, overrides=overrides,
                          torchrun_args=torchrun_args)
