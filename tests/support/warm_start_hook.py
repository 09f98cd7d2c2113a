"""The stub half of a warm start: run by the venv's `kubetune-tests-warm-start.pth` at
every interpreter start of the suite (``make test`` and ``make matrix-test`` write it), it
does nothing unless ``TESTS_WARM_START`` names a warm-start server
(tests/support/warm_start_server.py) and this process is one of the warm commands
(``WARM_MODULES``, ``WARM_SCRIPTS``). Then it hands the server its command, environment, working
directory, umask and standard streams; the server forks a process that imported
torchtune already, which runs the command in this one's place. This process stays what
its parent started and waits on: it passes on the signals it gets and ends as that
process ends (its exit code, or killed by its signal). Killed itself (SIGKILL), its end
of the socket closes and the warm process kills itself and what it started.

Anything that does not go as planned here (no server, a refused command) starts the
command the usual way: a warm start only saves the imports.
"""

import os


# The commands that fork warm: the torchtune ones (the recipe process, torchrun, plain
# torchtune's CLI), whose imports are 3-4 CPU-seconds, and kubetune's own steps (the
# launcher, `kubetune local`, the initializers, the exporter), which import datasets,
# pyarrow and, for the exporter, torchtune: about a second each, hundreds per suite run.
WARM_MODULES = ("kubetune.trainer.recipe_process.bootstrap", "torch.distributed.run",
                "torchtune._cli.tune", "kubetune.entrypoints", "kubetune.entrypoints.tune")
# The venv's console scripts of those commands.
WARM_SCRIPTS = ("kubetune", "tune", "tune-torchtune")


def _target(argv: list[str]) -> dict | None:
    """What the command runs, where it is one of the warm ones: ``python [-u] [-P] [-B]
    -m MODULE ...``, one of ``WARM_SCRIPTS`` or a bench script (the bench's CPU smoke:
    tests/test_bench_gpu.py), with the arguments after it."""
    flags = []
    i = 1
    while i < len(argv) and argv[i] in ("-u", "-P", "-B"):
        flags.append(argv[i])
        i += 1
    rest = argv[i:]
    if len(rest) >= 2 and rest[0] == "-m":
        if rest[1] in WARM_MODULES:
            return {"module": rest[1], "args": rest[2:], "flags": flags}
        return None
    if rest and _warm_script(rest[0]):
        return {"script": os.path.abspath(rest[0]), "args": rest[1:], "flags": flags}
    return None


def _warm_script(path: str) -> bool:
    if os.path.basename(path) in WARM_SCRIPTS:
        return True
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "bench")
    return path.endswith(".py") and os.path.dirname(os.path.abspath(path)) == bench


def _stream(fd: int) -> dict | None:
    import sys

    stream = {0: sys.stdin, 1: sys.stdout, 2: sys.stderr}[fd]
    try:
        os.fstat(fd)
    except OSError:
        return None
    return {"encoding": getattr(stream, "encoding", None),
            "errors": getattr(stream, "errors", None)}


def _read_line(conn) -> dict | None:
    import json

    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def _warm_start(address: str) -> None:
    import json
    import socket
    import sys

    target = _target(list(sys.orig_argv))
    if target is None:
        return
    streams = {fd: _stream(fd) for fd in (0, 1, 2)}
    fds = [fd for fd, s in streams.items() if s is not None]
    request = {**target, "env": dict(os.environ), "cwd": os.getcwd(),
               "umask": os.umask(0o022), "path": list(sys.path), "orig_argv": sys.orig_argv,
               "streams": {str(fd): s for fd, s in streams.items() if s is not None}}
    os.umask(request["umask"])
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(address)
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], fds)
        answer = _read_line(conn)
    except OSError:
        return
    if not answer or "pid" not in answer:
        conn.close()
        return  # refused (another environment at import, say): a cold start
    try:
        _stand_in(conn, answer["pid"], fds)
    finally:
        os._exit(1)  # whatever happens, never a second start of the command here


def _stand_in(conn, pid: int, fds: list[int]) -> None:
    """Wait for the warm process ``pid`` to end, passing on signals; end as it ended."""
    import signal

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                   signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT):
        signal.signal(signum, forward)
    # The streams are the warm process's now; a pipe's reader sees its end when that
    # process ends, not when this one does.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        os.dup2(null, fd)
    end = _read_line(conn) or {"exit": 1}
    if "signal" in end:
        signum = end["signal"]
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    os._exit(end.get("exit", 1))

if os.environ.get("TESTS_WARM_START"):
    _warm_start(os.environ["TESTS_WARM_START"])
