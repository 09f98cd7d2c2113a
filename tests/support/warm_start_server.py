"""The server half of a warm start (the stub half: tests/support/warm_start_hook.py).

A training run in the suite is a recipe process (and, under torchrun, torchrun and its
workers) and an export, each of which imports torchtune first: 3-4 CPU-seconds before it
does anything, about half of the suite's CPU. Around them, kubetune's steps (the launcher,
`kubetune local`, the initializers) import datasets and pyarrow, about a second each,
hundreds of times a run. This server keeps, per environment that
importing depends on, one process that imported torchtune already (a *zygote*), and runs
each such command in a child forked from it: the command's own arguments, environment,
working directory, umask and standard streams, its own process group, run as ``python -m``
runs it. What the child cannot show is what happens while the libraries import (their
import-time output is the zygote's), so a command that would show it (a debug log level)
starts cold. An environment at import that no zygote has gets one at its second command
(the first starts cold); past ``MAX_ZYGOTES`` the least recently used goes, once the
commands it runs have ended.

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
# What kubetune sets before huggingface_hub is imported (kubetune/remote/hub.py), which
# the library reads at import: a zygote imports it so too, or a warm initializer would ask
# the hub for its telemetry registry and draw progress bars where a cold one does not.
PRE_IMPORT_DEFAULTS = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
MAX_ZYGOTES = 6
# What the warm commands import before they do anything: torchtune's (the recipes, the
# exporter), datasets' (the launcher's split patterns, under torchtune's), pyarrow's
# (the dataset initializer's checks) and the CLI's and S3 client's.
WARM_IMPORTS = ("torch", "torchtune", "torchtune.training", "torchtune.modules.peft",
                "torchtune.config", "omegaconf", "torch.distributed.run",
                "datasets.data_files", "pyarrow.dataset", "pyarrow.parquet", "click", "boto3")
# Signals a child starts with as a fresh interpreter has them.
_IGNORED_AT_START = (signal.SIGPIPE, signal.SIGXFSZ)


def import_env(env: dict[str, str]) -> tuple:
    env = {**PRE_IMPORT_DEFAULTS, **env}
    return tuple(sorted((k, v) for k, v in env.items()
                        if k.startswith(IMPORT_ENV_PREFIXES) and k not in IMPORT_ENV_EXEMPT
                        and not k.startswith(IMPORT_ENV_EXEMPT_PREFIXES)
                        and not (k == "PYTHONPATH" and not _shadows_a_library(v))))


def _top_level_names(directory: str) -> set[str]:
    try:
        entries = os.listdir(directory)
    except OSError:
        return set()
    return {name.split(".")[0] for name in entries
            if name.endswith((".py", ".so", ".pyc")) or "." not in name}


_LIBRARY_NAMES: set[str] = set()


def _shadows_a_library(pythonpath: str) -> bool:
    """Whether a ``PYTHONPATH`` entry holds a module named as one of the interpreter's own
    (the standard library's, site-packages'): what a zygote imported would then differ.
    A test's own builders and plugins do not; the child finds them on its ``sys.path``."""
    if not _LIBRARY_NAMES:
        _LIBRARY_NAMES.update(sys.builtin_module_names)
        for directory in sys.path:
            if directory and os.path.isdir(directory):
                _LIBRARY_NAMES.update(_top_level_names(directory))
    return any(_top_level_names(entry) & _LIBRARY_NAMES
               for entry in pythonpath.split(os.pathsep) if entry)


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
    os.environ.update({**PRE_IMPORT_DEFAULTS, **env})
    try:
        for module in WARM_IMPORTS:
            __import__(module)
    except Exception:  # a malformed HF_ENDPOINT, say: the commands of this env start cold
        import traceback

        traceback.print_exc()
        os._exit(1)
    # Nothing the imports printed may wait in a buffer a child would flush as its own.
    sys.stdout.flush()
    sys.stderr.flush()
    # The imports' objects out of the collector's sight: a child's collections would
    # otherwise walk (and so copy, page by page) the whole heap it shares with this one.
    import gc

    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    serving = True
    while serving or children:
        readable, _, _ = select.select([control, wake_r] if serving else [wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(children)
        if serving and control in readable:
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 8)
            if not message:
                # The manager is gone, or let this zygote go: it ends once the commands it
                # runs have ended and their stubs have their exit codes.
                serving = False
                continue
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
    os._exit(0)


def _reap(children: dict[int, socket.socket]) -> None:
    """Every child that ended; those in ``children`` tell their stubs how."""
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

    try:
        if "module" in request:
            sys.argv = ["-m", *request["args"]]
            # Run as `python -m` runs it: executed anew as __main__, not the zygote's import.
            sys.modules.pop(request["module"], None)
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [request["script"], *request["args"]]
            runpy.run_path(request["script"], run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code)


def _exit_code(stop: SystemExit) -> int:
    """The exit status the interpreter gives ``sys.exit(x)``."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def _exit(code: int) -> None:
    """End as the interpreter ends (its non-daemon threads waited for, the atexit
    functions run, the standard streams flushed) but without tearing down the modules:
    a fork of the zygote would tear down torch's and torchtune's too, 0.25 CPU-s (1.4
    without the collector's freeze) that a cold command of kubetune's light steps never
    pays. A file left unclosed is not flushed here as it would be in that tear-down."""
    import threading

    try:
        threading._shutdown()
    except BaseException:
        pass
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            code = code or 120  # what the interpreter exits with when a flush at exit fails
    if code == -signal.SIGINT:  # an uncaught Ctrl-C: the interpreter dies by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


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
        # Least recently used first: past MAX_ZYGOTES the first one goes.
        self.zygotes: dict[tuple, tuple[int, socket.socket]] = {}
        self.seen: dict[tuple, int] = {}  # requests per environment at import
        self.served = self.cold = self.retired = 0

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
            _reap({})  # the zygotes that ended after being let go (no stub waits on them)

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
            _send(conn, {"cold": why or "the first command of its environment"})
        else:
            self.served += 1
            try:
                socket.send_fds(zygote, [json.dumps(request).encode()], [conn.fileno(), *fds])
            except OSError:  # its imports failed (a malformed HF_ENDPOINT, say): cold
                self.zygotes.pop(import_env(request["env"]), None)
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
            self.zygotes[key] = self.zygotes.pop(key)  # the most recently used now
            return self.zygotes[key][1]
        # A zygote costs its imports (5-6 CPU-s), a cold command 1-4: an environment seen
        # once (a test's own HF_HOME) starts cold, the second command of it starts one.
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen[key] < 2:
            return None
        if self.zygotes:  # which variables made another one: the log says
            nearest = min(self.zygotes, key=lambda z: len(set(z) ^ set(key)))
            print(json.dumps({"zygote": len(self.zygotes) + 1,
                              "differs": sorted({k for k, _ in set(nearest) ^ set(key)})}),
                  file=sys.stderr, flush=True)
        if len(self.zygotes) >= MAX_ZYGOTES:
            # The least recently used goes (after its running commands: zygote_main), so
            # that a run's new environment (a test's hub server) is served too.
            oldest = next(iter(self.zygotes))
            self.zygotes.pop(oldest)[1].close()
            self.retired += 1
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
            zygote_main(theirs, env)  # never returns
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
        print(json.dumps({"served": self.served, "cold": self.cold, "retired": self.retired}),
              file=sys.stderr)


if __name__ == "__main__":
    manager = Manager(sys.argv[1])
    print("ready", flush=True)
    manager.serve()
