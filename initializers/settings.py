"""The initializers' tuning, as the pod spec sets it: each variable parsed here, once per
reader, typed, with its default (a bad value is one line naming it, exit 65:
`kubetune.env_numbers`).

Each value is parsed when first asked for, as each was before it moved here: a setting the
run never uses (the S3 part size of a hub download) is never read."""

from __future__ import annotations

import os
from functools import cached_property
from typing import Mapping

from kubetune import env
from kubetune.env_numbers import env_float, env_int

DEFAULT_DOWNLOAD_WORKERS = 8
DEFAULT_S3_PART_MB = 16
DEFAULT_S3_PART_WORKERS = 8
DEFAULT_PROGRESS_INTERVAL_S = 5.0


class InitializerSettings:
    """``environ``: the variables to read (default: this process's)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ  # the pod spec's values

    def _count(self, name: str, default: int) -> int:
        # 0 or below is refused (exit 65 naming the variable), never quietly run as 1.
        return env_int(name, default, minimum=1, environ=self._environ)

    @cached_property
    def download_workers(self) -> int:
        """Files fetched at once."""
        return self._count(env.DOWNLOAD_WORKERS, DEFAULT_DOWNLOAD_WORKERS)

    @cached_property
    def s3_part_size(self) -> int:
        """Bytes of the largest ranged GET of a split S3 object."""
        return self._count(env.S3_PART_SIZE_MB, DEFAULT_S3_PART_MB) * 1024 * 1024

    @cached_property
    def s3_part_workers(self) -> int:
        """Ranged parts in flight, across all objects."""
        return self._count(env.S3_PART_WORKERS, DEFAULT_S3_PART_WORKERS)

    @cached_property
    def progress_interval_s(self) -> float:
        """Seconds between two progress lines."""
        # 0 would spin and flood the log: refused.
        return env_float(env.PROGRESS_INTERVAL_S, DEFAULT_PROGRESS_INTERVAL_S, above=0,
                         environ=self._environ)
