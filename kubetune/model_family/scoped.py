"""Change a torchtune module-level table or function for the length of one call.

torchtune's checkpointer picks its HF conversion by ``model_type`` and reads the key
tables and converters of that family at call time. A family whose checkpoints differ from
torchtune's table in a few keys (Qwen3) or whose table is wrong (Gemma 2) runs torchtune's
own code with the table corrected for that call only, so no other model in the process
sees the change.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def patched(target: Any, table_name: str | None = None, *, updates: dict | None = None,
            attribute: str | None = None, value: Any = None,
            replace: bool = False) -> Iterator[None]:
    """``updates`` merged into ``target.<table_name>`` (a dict; ``replace``: the table's
    whole content), or ``target.<attribute>`` set to ``value``; both restored on exit."""
    if table_name is not None:
        table = getattr(target, table_name)
        saved = dict(table)
        if replace:
            table.clear()
        table.update(updates or {})
        try:
            yield
        finally:
            table.clear()
            table.update(saved)
        return
    saved_value = getattr(target, attribute)
    setattr(target, attribute, value)
    try:
        yield
    finally:
        setattr(target, attribute, saved_value)
