"""A process that removes one `kubetune local --engine` run's containers and network the
moment its `kubetune local` dies, `kill -9` included.

The engine runs the containers, not the `podman run` / `docker run` clients that die with
`kubetune local`: without this, a killed run's trainer trains on, holding its GPUs, until
the next run in the same work directory removes it (`ContainerSession.remove_orphans`).

How it knows: it reads a pipe whose only writer is `kubetune local` (steps inherit no
descriptor but their stdio). A clean end writes `done` and closes it: nothing to do (the
run removed its own). End of file without `done` means the writer died: it removes every
container labelled with the run, and the run's network. It runs in its own session, so a
terminal's Ctrl-C or hang-up, or a kill of `kubetune local`'s process group, misses it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from kubetune.tools.local.container_argv import (labelled_containers_argv,
                                                 network_remove_argv, remove_argv)

DONE = b"done"
ENGINE_TIMEOUT_S = 120


class Watchdog:
    """The watchdog of one run, started by ``start``; ``release`` at the run's clean end."""

    def __init__(self, process: subprocess.Popen, writer: int) -> None:
        self._process = process
        self._writer: int | None = writer

    def release(self) -> None:
        """The run removed its own containers: the watchdog exits without touching any."""
        if self._writer is None:
            return
        try:
            os.write(self._writer, DONE)
        except OSError:
            pass  # it is gone already: nothing is left to tell
        finally:
            os.close(self._writer)
            self._writer = None
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass  # it exits on its own; no reason to hold up the run's end for it


def start(engine: str, label: str, value: str, network: str, log: Path) -> Watchdog:
    """Watch this process: when it dies without ``release``, remove every container
    labelled ``label=value`` and ``network`` (what it did goes to ``log``)."""
    reader, writer = os.pipe()  # not inheritable: the steps never hold the writer
    try:
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-P", "-m", __name__, engine, label, value, network],
                stdin=reader, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    except BaseException:
        os.close(writer)
        raise
    finally:
        os.close(reader)
    return Watchdog(process, writer)


def _engine(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)


def main(engine: str, label: str, value: str, network: str) -> int:
    # Its own session already; a hang-up of a terminal it never had is no reason to stop.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    said = sys.stdin.buffer.read()  # until the writer says done, or dies
    if said == DONE:
        return 0
    names = _engine(labelled_containers_argv(engine, label, value)).stdout.split()
    if names:
        removed = _engine(remove_argv(engine, names))
        for name in names:
            print(f"kubetune local ({label}={value}) died: removing container {name}: "
                  + ("done" if removed.returncode == 0 else removed.stderr.strip()),
                  flush=True)
    _engine(network_remove_argv(engine, network))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
