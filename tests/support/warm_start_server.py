"""The server half of a warm start (the stub half: tests/support/warm_start_hook.py).

A training run in the suite is a recipe process (and, under torchrun, torchrun and its
workers) and an export, each of which imports torchtune first: 3-4 CPU-seconds before it
does anything, about half of the suite's CPU. This server keeps, per environment that
importing depends on, one process that imported torchtune already (a *zygote*), and runs
each such command in a child forked from it: the command's own arguments, environment,
working directory, umask and standard streams, its own process group, run as ``python -m``
runs it. What the child cannot show is what happens while the libraries import (their
import-time output is the zygote's), so a command that would show it (a debug log level)
starts cold, as does one whose environment at import no zygote has, past
``MAX_ZYGOTES``.

Nothing of kubetune is imported here: its modules read the environment when imported,
and a child imports them itself, in its own environment.

Started by tests/support/warm_start.py, one per pytest process:
``python tests/support/warm_start_server.py SOCKET``; it ends when its stdin closes.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import sys
import threading

# Variables a library reads while it is imported (or that decide what it imports): a
# command whose values differ from a zygote's needs another zygote.
IMPORT_ENV_PREFIXES = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "DATASETS", "TORCH", "PYTORCH",
                       "CUDA", "OMP_", "MKL", "KMP_", "OPENBLAS", "TOKENIZERS", "TRITON",
                       "XDG_", "PYTHON", "LC_", "LANG", "TQDM", "TMPDIR", "HOME", "LD_")
# Read after the import, or applied to the child here (OMP_NUM_THREADS: torch's threads).
IMPORT_ENV_EXEMPT = {"OMP_NUM_THREADS", "PYTHONUNBUFFERED", "PYTHONSAFEPATH",
                     "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
# torchrun's per-run variables for its workers, read when the process group forms.
IMPORT_ENV_EXEMPT_PREFIXES = ("TORCHELASTIC_",)
MAX_ZYGOTES = 6
# What the warm commands import before they do anything.
WARM_IMPORTS = ("torch", "torchtune", "torchtune.training", "torchtune.modules.peft",
                "torchtune.config", "omegaconf", "torch.distributed.run")
# Signals a child starts with as a fresh interpreter has them.
_IGNORED_AT_START = (signal.SIGPIPE, signal.SIGXFSZ)


def import_env(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items()
                        if k.startswith(IMPORT_ENV_PREFIXES) and k not in IMPORT_ENV_EXEMPT
                        and not k.startswith(IMPORT_ENV_EXEMPT_PREFIXES)))


def refusal(request: dict) -> str | None:
    """Why this command starts cold, if it must."""
    env = request["env"]
    if env.get("KUBETUNE_LOG_LEVEL", "").lower() == "debug":
        return "debug: the libraries' import-time lines are what it shows"
    # Code that runs at interpreter start (test_secrets probes the recipe's environment
    # so): a fork never starts an interpreter.
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.isfile(os.path.join(entry, "sitecustomize.py")):
            return "a sitecustomize on PYTHONPATH runs at interpreter start"
    return None


def _send(sock: socket.socket, message: dict) -> None:
    try:
        sock.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the stub is gone: its child was killed with it


# -- the zygote: imports once, forks a child per command -----------------------------------

def zygote_main(control: socket.socket, env: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env)
    for module in WARM_IMPORTS:
        __import__(module)
    # Nothing the imports printed may wait in a buffer a child would flush as its own.
    sys.stdout.flush()
    sys.stderr.flush()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([control, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(children)
        if control in readable:
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 8)
            if not message:
                os._exit(0)  # the manager is gone
            request = json.loads(message)
            conn, stdio = socket.socket(fileno=fds[0]), fds[1:]
            pid = os.fork()
            if pid == 0:
                for other in children.values():
                    other.close()
                control.close()
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                child_main(request, conn, stdio)  # never returns: the child exits
            for fd in stdio:
                os.close(fd)
            children[pid] = conn
            _send(conn, {"pid": pid})


def _reap(children: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        _send(conn, {"signal": -code} if code < 0 else {"exit": code})
        conn.close()


# -- the child: becomes the command ------------------------------------------------------

def child_main(request: dict, conn: socket.socket, stdio: list[int]) -> None:
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in _IGNORED_AT_START:
        signal.signal(signum, signal.SIG_IGN)
    # Its own group: a kill of the group (the stub gone) takes what it started with it.
    os.setpgid(0, 0)
    fds = [int(fd) for fd in request["streams"]]
    for fd, received in zip(fds, stdio):
        os.dup2(received, fd)
        os.close(received)
    for fd in {0, 1, 2} - set(fds):
        os.close(fd)
    threading.Thread(target=_die_with_stub, args=(conn,), daemon=True).start()
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.orig_argv = request["orig_argv"]
    safe_path = "-P" in request["flags"] or bool(request["env"].get("PYTHONSAFEPATH"))
    # What `python -m` (the working directory) or `python SCRIPT` (its directory) puts first.
    first = os.path.dirname(request["script"]) if "script" in request else request["cwd"]
    sys.path[:] = request["path"] if safe_path else [first, *request["path"]]
    unbuffered = "-u" in request["flags"] or bool(request["env"].get("PYTHONUNBUFFERED"))
    _fresh_stdio(request["streams"], unbuffered)
    _fresh_state(request["env"])
    import runpy

    if "module" in request:
        sys.argv = ["-m", *request["args"]]
        # Run as `python -m` runs it: executed anew as __main__, not the zygote's import.
        sys.modules.pop(request["module"], None)
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [request["script"], *request["args"]]
        runpy.run_path(request["script"], run_name="__main__")
    sys.exit(0)  # the interpreter's own exit: atexit, threads, flushes, as a cold one's


def _die_with_stub(conn: socket.socket) -> None:
    """The stub's end closes when it dies (SIGKILL): this process and its group go too."""
    while True:
        try:
            if not conn.recv(1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os.killpg(0, signal.SIGKILL)


def _fresh_stdio(streams: dict[str, dict], unbuffered: bool) -> None:
    """sys.stdin/stdout/stderr as the interpreter makes them at start, on the command's
    streams."""
    made = {}
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        spec = streams.get(str(fd))
        if spec is None:
            made[name] = None
            continue
        raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
        if fd == 0:
            binary = io.BufferedReader(raw)
        else:
            binary = raw if unbuffered else io.BufferedWriter(raw)
        line_buffering = fd == 2 or (fd == 1 and raw.isatty())
        made[name] = io.TextIOWrapper(binary, encoding=spec["encoding"], errors=spec["errors"],
                                      line_buffering=line_buffering and not unbuffered,
                                      write_through=unbuffered and fd != 0)
    old = {id(sys.stdout): "stdout", id(sys.stderr): "stderr"}
    for name, stream in made.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    # The libraries' log handlers made while the zygote imported them (torchtune's, at
    # its import) hold the zygote's streams. A cold process makes them later, after the
    # recipe process has put its own streams in place (the progress bar's line ending):
    # each now writes to whatever sys.stdout or sys.stderr is when it writes.
    import logging

    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager
                                      .loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            name = old.get(id(getattr(handler, "stream", None)))
            if isinstance(handler, logging.StreamHandler) and name:
                handler.stream = _Current(name)


class _Current:
    """sys.stdout or sys.stderr, whichever object it is at the time of each write."""

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, text: str) -> int:
        return getattr(sys, self.name).write(text)

    def flush(self) -> None:
        getattr(sys, self.name).flush()

    def __getattr__(self, attr: str):
        return getattr(getattr(sys, self.name), attr)


def _fresh_state(env: dict[str, str]) -> None:
    """What a fresh interpreter would have read from this environment, or drawn anew."""
    import tempfile

    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


# -- the manager: one zygote per environment at import -----------------------------------

class Manager:
    def __init__(self, address: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(address)
        self.listener.listen(64)
        self.zygotes: dict[tuple, tuple[int, socket.socket]] = {}
        self.served = self.cold = 0

    def serve(self) -> None:
        stdin = sys.stdin.fileno()
        while True:
            readable, _, _ = select.select([self.listener, stdin], [], [])
            if stdin in readable and not os.read(stdin, 4096):
                self.stop()
                return
            if self.listener in readable:
                conn, _ = self.listener.accept()
                self.handle(conn)

    def handle(self, conn: socket.socket) -> None:
        try:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while message and not message.endswith(b"\n"):
                more = conn.recv(1 << 20)
                if not more:
                    break
                message += more
            request = json.loads(message)
        except (OSError, ValueError):
            conn.close()
            return
        why = refusal(request)
        zygote = None if why else self.zygote_for(request["env"], conn, fds)
        if zygote is None:
            self.cold += 1
            _send(conn, {"cold": why or "no zygote for this environment"})
        else:
            self.served += 1
            try:
                socket.send_fds(zygote, [json.dumps(request).encode()], [conn.fileno(), *fds])
            except OSError:
                _send(conn, {"cold": "the zygote is gone"})
        for fd in fds:
            os.close(fd)
        conn.close()

    def zygote_for(self, env: dict[str, str], conn: socket.socket, fds: list[int]
                   ) -> socket.socket | None:
        """The zygote for ``env``, started if need be (``conn`` and ``fds``: the request
        in hand, which a new zygote must not keep: a pipe held open never ends)."""
        key = import_env(env)
        if key in self.zygotes:
            return self.zygotes[key][1]
        if self.zygotes:  # which variables made another one: the log says
            nearest = min(self.zygotes, key=lambda z: len(set(z) ^ set(key)))
            print(json.dumps({"zygote": len(self.zygotes) + 1,
                              "differs": sorted({k for k, _ in set(nearest) ^ set(key)})}),
                  file=sys.stderr, flush=True)
        if len(self.zygotes) >= MAX_ZYGOTES:
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            conn.close()
            for fd in fds:
                os.close(fd)
            self.listener.close()
            for _, other in self.zygotes.values():
                other.close()
            zygote_main(theirs, env)
            os._exit(0)
        theirs.close()
        self.zygotes[key] = (pid, ours)
        return ours

    def stop(self) -> None:
        for pid, sock in self.zygotes.values():
            sock.close()
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        print(json.dumps({"served": self.served, "cold": self.cold}), file=sys.stderr)


if __name__ == "__main__":
    manager = Manager(sys.argv[1])
    print("ready", flush=True)
    manager.serve()
