"""Kubernetes resource quantities (``2500m``, ``80Gi``, ``1.5``, ``4``) as exact numbers,
and memory sizes as people also write them (``80GB``, ``80GiB``).

One reader for the two places that meet them: `kubetune local` counting GPUs and CPUs in
a runtime's resources as the controller does, and `kubetune size` reading a GPU's memory
and writing the ``memory`` a TrainJob's ``resourcesPerNode`` asks for.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIXES = {"m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6,
             "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15,
             "E": Decimal(10) ** 18, "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20,
             "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50,
             "Ei": Decimal(2) ** 60}
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")
# How memory is written outside Kubernetes: "80GB" is 80 x 10^9 bytes, "80GiB" 80 x 2^30.
_BYTE_UNITS = {"B": "", "KB": "k", "MB": "M", "GB": "G", "TB": "T", "KIB": "Ki",
               "MIB": "Mi", "GIB": "Gi", "TIB": "Ti"}


def parse(value: object) -> Decimal | None:
    """``value`` (a YAML number or a quantity string) as an exact number; None where it is
    not a quantity."""
    match = _QUANTITY.match(str(value))
    if match is None or match.group(2) not in ("", *_SUFFIXES):
        return None
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        return None
    return number * _SUFFIXES.get(match.group(2), Decimal(1))


def whole(quantity: Decimal) -> int:
    """The quantity rounded up to a whole number, as Kubernetes' ``Quantity.Value()``
    counts it: 2.5 CPUs or 2500m are 3."""
    return int(math.ceil(quantity))


def memory_bytes(text: str) -> int | None:
    """A memory size in bytes: a Kubernetes quantity (``80Gi``, ``85899345920``) or a
    size with a byte unit (``80GB``, ``80GiB``, any case); None where it is neither or is
    not positive."""
    match = _QUANTITY.match(str(text))
    if match is None:
        return None
    unit = match.group(2)
    suffix = _BYTE_UNITS.get(unit.upper(), unit) if unit.upper().endswith("B") else unit
    number = parse(match.group(1) + suffix)
    if number is None or number <= 0:
        return None
    return whole(number)


def gibibytes(n_bytes: float) -> str:
    """``n_bytes`` as a whole number of GiB, rounded up: what a resource request asks
    for (``"75Gi"``)."""
    return f"{max(1, math.ceil(n_bytes / 2 ** 30))}Gi"
