"""pip's configuration as uv's environment: `make venv`, the tests' serving venv and
`make demo-real`'s converter venv install with uv (seconds where pip took minutes:
docs/testing.md), which reads no pip.conf, and must still see the indexes, local wheels and constraints this machine set
up for pip (on a build machine: a CPU torch wheel on disk instead of GBs of CUDA ones).

Run as a script (by `make venv`, before any venv exists: standard library only), it
prints `export UV_...='...'` lines for `eval`. pip treats every index alike and takes
the best version from any; uv by default stops at the first index that has the name, so
the strategy is set to pip's.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

# pip's key -> uv's variable; list values stay space-separated, as both read them.
UV_NAMES = {
    "index-url": "UV_DEFAULT_INDEX",
    "extra-index-url": "UV_EXTRA_INDEX_URL",
    "find-links": "UV_FIND_LINKS",
    "constraint": "UV_CONSTRAINT",
    "default-timeout": "UV_HTTP_TIMEOUT",
    "cert": "SSL_CERT_FILE",
}


def pip_settings() -> dict[str, str]:
    """pip's effective settings: its environment variables over its files."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, check=True).stdout
    from_files: dict[str, str] = {}
    from_env: dict[str, str] = {}
    for line in listed.splitlines():
        match = re.fullmatch(r"(:env:|[\w-]+)\.([\w-]+)='(.*)'", line.strip())
        if match:
            scope, key, value = match.groups()
            (from_env if scope == ":env:" else from_files)[key] = value
    return {**from_files, **from_env}


def uv_environment() -> dict[str, str]:
    """The variables that make uv install from where pip would."""
    env = {"UV_INDEX_STRATEGY": "unsafe-best-match"}
    for key, value in pip_settings().items():
        if key in UV_NAMES:
            # uv reads find-links as a comma-separated list, the others space-separated.
            env[UV_NAMES[key]] = ",".join(value.split()) if key == "find-links" else value
    return env


def main() -> None:
    print("\n".join(f"export {name}={shlex.quote(value)}"
                    for name, value in uv_environment().items()))


if __name__ == "__main__":
    main()
