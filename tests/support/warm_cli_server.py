"""The warm process behind tests/support/warm_cli.py: torch imported once, a child forked
for each `kubetune` command.

Run as ``python -m tests.support.warm_cli_server`` (cwd: the repository). It imports the
libraries whose import is most of a torch-using step's start-up (torch, torchao, and
pandas / pyarrow under datasets) and nothing that reads our configuration: not kubetune,
not huggingface_hub nor datasets (they read ``HF_ENDPOINT``, ``HF_HOME`` and the like
as they are imported, and kubetune sets some of those before it imports them). Each
child imports those itself, under its own environment, as a pod's process does.

Protocol, one JSON line each way on stdin/stdout: a request ``{"module", "args", "env",
"cwd", "umask", "stdout", "stderr"}`` (the child runs ``python -m MODULE ARGS``; the
last two: files its output goes to); the
answer ``{"pid"}`` once the child runs, then ``{"exit", "cpu_s"}`` (its exit code, or
minus the signal that ended it, as subprocess reports it; its CPU seconds) once it ended.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import signal
import sys
import time
import traceback

# Imported here, in every child already: none of them reads our variables at import.
PRELOADED = ("torch", "torchao", "safetensors.torch", "numpy", "pandas", "pyarrow",
             "pyarrow.parquet")
# Read configuration as they are imported (or are ours): a child imports them itself.
NOT_PRELOADED = ("kubetune", "huggingface_hub", "datasets", "transformers", "torchtune",
                 "boto3", "botocore")


def preload() -> None:
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    pulled = sorted({m.split(".")[0] for m in sys.modules} & set(NOT_PRELOADED))
    if pulled:  # a new torch or torchao version imports one: a child would see stale values
        raise SystemExit(f"warm_cli_server: preloading imported {pulled}")


def _process_log():
    """tests/support/process_log.py where `make test-profile` installed it, else None."""
    return sys.modules.get("_kubetune_process_log")


def _log_start(module: str, args: list[str]) -> None:
    log = _process_log()
    if log is None or not log._PATH:
        return
    # Inherited from the warm process: this child's end is written by _log_end.
    atexit.unregister(log._at_exit)
    log._write({"pid": os.getpid(), "ppid": os.getppid(), "start": time.time(),
                "argv": ["<forked>", "-m", module, *args][:12], "forked": True,
                "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
                "worker": os.environ.get("PYTEST_XDIST_WORKER", "")})


def _log_end() -> None:
    log = _process_log()
    if log is None or not log._PATH:
        return
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)  # a forked child's own, from zero
    # torch came with the fork, not imported here; torchtune a child imports itself.
    log._write({"pid": os.getpid(), "end": time.time(), "cpu": usage.ru_utime + usage.ru_stime,
                "torch": False, "torchtune": "torchtune" in sys.modules})


def _streams(stdout: str, stderr: str) -> None:
    """fds 0-2 as subprocess.run(capture_output=True) gives them (stdin: nothing to read),
    and sys's streams over them as a fresh interpreter opens them for pipes."""
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w",
                                                                                closefd=False)))
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)), errors="backslashreplace",
        line_buffering=True)


def _exit_code(code: object) -> int:
    """What the interpreter makes of ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def child(request: dict) -> None:
    """Run one command as ``python -m MODULE ARGS`` would; never returns."""
    import posix  # its _exit: os._exit may be the process log's wrapper

    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        if request["umask"] != -1:
            os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        _streams(request["stdout"], request["stderr"])
        _log_start(request["module"], request["args"])
        code = _run_module(request["module"], request["args"])
        atexit._run_exitfuncs()  # logging's shutdown flushes, as at a normal exit
        _log_end()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 (a closed stream: nothing left to write)
                pass
    except BaseException:  # noqa: BLE001 (this module's bug: said where the test reads)
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        posix._exit(code)


def _run_module(module: str, args: list[str]) -> int:
    """``python -m module args``: its exit code as the interpreter gives it."""
    import runpy

    sys.argv = ["-m", *args]  # runpy puts the module's path first
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as stop:
        return _exit_code(stop.code)
    except BaseException:  # noqa: BLE001 (the interpreter prints it and exits 1)
        traceback.print_exc()
        return 1


def serve() -> None:
    preload()
    reply = sys.stdout
    reply.write(json.dumps({"ready": True}) + "\n")
    reply.flush()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(request)
        reply.write(json.dumps({"pid": pid}) + "\n")
        reply.flush()
        _, status, usage = os.wait4(pid, 0)
        reply.write(json.dumps({"exit": os.waitstatus_to_exitcode(status),
                                "cpu_s": usage.ru_utime + usage.ru_stime}) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve()
