"""How the user set a config value, so that a hint about it reads in their syntax.

`kubetune train`'s options and their environment variables stand for config keys
(``KUBETUNE_COLUMN_MAP`` and ``--column-map`` for ``dataset.column_map``): a runtime user
told to "set dataset.column_map=..." is sent to a key they never wrote. The request
carries, for each key an option or variable set, which one (``TuneRunRequest.spellings``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Spelling:
    key: str  # the config key, e.g. dataset.column_map
    setting: str | None = None  # the variable or option that set it; None: the key itself

    @property
    def name(self) -> str:
        return self.setting or self.key

    @property
    def is_key(self) -> bool:
        return self.setting is None

    def assign(self, value: str) -> str:
        """Setting ``value`` as the user would write it."""
        if self.setting is None:
            return f"{self.key}={value}"
        if self.setting.startswith("-"):
            return f"{self.setting} {value}"
        return f"{self.setting}={value}"


def spelling(spellings: dict[str, str], key: str) -> Spelling:
    """``key``'s spelling among a request's ``spellings`` (key -> setting)."""
    return Spelling(key, spellings.get(key))
