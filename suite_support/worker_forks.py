"""Worker processes forked from one that imported their engine once.

The engine crash tests run every scenario as two real processes (one
killed by SIGKILL at its crash point, one that recovers). Started with
``python -m``, each paid for importing its engine again (LangGraph, DBOS,
Pydantic AI: 1 to 3 s a process, most of each scenario's time). Here one
server process per worker module imports what that module imports at its
top (every package but the suite's own) and forks a child per run; the
child runs the module as ``python -m`` would (``runpy``, ``sys.argv``, its
own environment, working directory and output files) and exits the
interpreter's normal way (threads joined, ``atexit`` run). It is a process
of its own: a crash point's SIGKILL ends it alone, and its exit status is
reported as ``subprocess`` reports it (``-9`` for SIGKILL).

Nothing the server imports starts a thread or reads the environment a run
is given (checked when the server starts: it refuses to fork with a thread
running). The server is started as a script (this file needs only the
standard library) and imports none of the suite's packages (checked), so
each child imports them afresh, as a new process does. Where a child
cannot be what a new process is, runs differ from it loudly or not at all:

* The hash seed is fixed when an interpreter starts. Each server has a
  random one of its own, and runs take turns between two servers per
  module, so a scenario's two processes (and two commands in a row) never
  share one. A run whose environment sets ``PYTHON*`` variables the server
  was not started with is refused (they act at start-up only).
* Its standard streams are made as Python makes them for files: stdout
  block-buffered (unbuffered with ``PYTHONUNBUFFERED``), stderr
  line-buffered with ``backslashreplace``.

    python suite_support/worker_forks.py MODULE   # the server; requests on stdin
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import dataclasses
import importlib
import io
import itertools
import json
import locale
import os
import random
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["ForkedRun", "run_forked"]

ROOT = Path(__file__).resolve().parents[1]
#: Packages each child imports afresh: the suite's own code.
_SUITE_PACKAGES = frozenset({"tests", "examples", "suite_support", "stateful_tests"})


@dataclasses.dataclass(frozen=True)
class ForkedRun:
    """One child's end: its exit status (negative: killed by that signal) and output."""

    returncode: int
    stdout: str
    stderr: str


def preloads(module: str) -> list[str]:
    """The modules ``module`` imports at its top, but for the suite's own (and ``dataoad``)."""
    # Read from its file, not found by import: that would import its packages here.
    path = ROOT / module.replace(".", "/")
    source = path / "__main__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    names = ["dataoad"]
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return [n for n in dict.fromkeys(names) if n.split(".")[0] not in _SUITE_PACKAGES]


class _Server:
    """The test's side of one server: start it, ask for runs, stop it."""

    def __init__(self, module: str, env: dict[str, str]) -> None:
        self.module = module
        # The children's output goes here, never into the folder a run works in.
        self.scratch = Path(tempfile.mkdtemp(prefix="dataoad-forks-"))
        self.busy = threading.Lock()
        # A seed of its own, as each new interpreter draws one (unless the
        # test process fixed one for all: then every new process has it too).
        self.env = {"PYTHONHASHSEED": str(random.randrange(1, 2**32)), **env}
        self.process = subprocess.Popen(
            [sys.executable, __file__, module],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self._unread = b""
        self._requests = itertools.count(1)
        ready = self._answer("ready", timeout=120.0)
        if ready.get("ready") is not True:
            raise RuntimeError(f"the fork server for {module} did not start: {ready}")

    def _answer(self, request: int | str, timeout: float) -> dict[str, Any]:
        """The server's next answer, which must be to ``request``.

        Read from the pipe's file descriptor, never through a buffered
        reader: a line such a reader took in ahead of time is one ``select``
        cannot see, and the next answer would be waited for in vain.
        """
        out = self.process.stdout
        assert out is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._unread:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([out], [], [], max(left, 0.0))
            if not readable:
                raise TimeoutError(
                    f"the fork server for {self.module} did not answer in {timeout} s"
                )
            chunk = os.read(out.fileno(), 65536)
            if not chunk:
                raise RuntimeError(
                    f"the fork server for {self.module} ended ({self.process.poll()})"
                )
            self._unread += chunk
        line, self._unread = self._unread.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        if answer.get("request") != request:
            raise RuntimeError(
                f"the fork server for {self.module} answered {answer}, not {request}"
            )
        return answer

    def run(self, args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> ForkedRun:
        # One run at a time: a test that wants processes side by side starts
        # them itself (queueing them here would make them take turns unseen).
        if not self.busy.acquire(blocking=False):
            raise RuntimeError(f"{self.module}: one forked run at a time; use subprocess.Popen")
        try:
            return self._run(args, env, cwd, timeout)
        except (RuntimeError, json.JSONDecodeError):
            self.stop()  # a server whose answers went astray serves nothing more
            raise
        finally:
            self.busy.release()

    def refuse_start_up_settings(self, env: dict[str, str]) -> None:
        """A ``PYTHON*`` variable acts when an interpreter starts: a forked child cannot honour it.

        (A run that names no hash seed gets the server's, as a new process
        draws one of its own.)
        """
        differ = sorted(
            name
            for name in set(env) | set(self.env)
            if name.startswith("PYTHON")
            and env.get(name) != self.env.get(name)
            and (name in env or name != "PYTHONHASHSEED")
        )
        if differ:
            raise RuntimeError(
                f"{self.module}: a forked run cannot take the start-up settings {differ}; "
                "start it with subprocess"
            )

    def _run(self, args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> ForkedRun:
        stdout, stderr = self.scratch / "stdout", self.scratch / "stderr"
        self.refuse_start_up_settings(env)
        number = next(self._requests)
        request = {
            "request": number,
            "args": args,
            "env": env,
            "cwd": str(cwd),
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        self.process.stdin.flush()
        pid = self._answer(number, timeout=30.0)["pid"]
        try:
            status = self._answer(number, timeout=timeout)["returncode"]
        except TimeoutError:
            # Not reaped yet (the server answers only after reaping it): still its pid.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._answer(number, timeout=30.0)
            raise subprocess.TimeoutExpired(
                [self.module, *args], timeout, stdout.read_text(), stderr.read_text()
            ) from None
        run = ForkedRun(status, stdout.read_text(), stderr.read_text())
        stdout.unlink()
        stderr.unlink()
        return run

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


_SERVERS: dict[tuple[str, str, int], _Server] = {}
#: Runs take turns between this many servers per module (see the hash seed above).
_TURNS = 2
_turn = itertools.count()
#: What the test process's environment holds for one test only.
_PER_TEST = frozenset({"PYTEST_CURRENT_TEST"})


def run_forked(
    module: str, args: list[str], env: dict[str, str], cwd: Path, timeout: float
) -> ForkedRun:
    """Run ``python -m module *args`` in ``cwd`` as a child of ``module``'s server, with ``env``.

    One server per module and test-process environment (the run itself
    gets ``env``), but for the variable pytest changes for every test.
    """
    shared = {k: v for k, v in os.environ.items() if k not in _PER_TEST}
    key = (module, json.dumps(sorted(shared.items())), next(_turn) % _TURNS)
    server = _SERVERS.get(key)
    if server is None or server.process.poll() is not None:
        server = _SERVERS[key] = _Server(module, shared)
    return server.run(args, env, cwd, timeout)


@atexit.register
def _stop_servers() -> None:
    for server in _SERVERS.values():
        server.stop()


# -- the server's side ------------------------------------------------------------------------


def _serve(module: str) -> int | None:
    """Fork a child per request; in the child, return None to run it (see __main__)."""
    for name in preloads(module):
        importlib.import_module(name)
    if threading.active_count() != 1:
        raise RuntimeError(f"importing {module}'s packages started a thread: cannot fork safely")
    suite = sorted(m for m in sys.modules if m.split(".")[0] in _SUITE_PACKAGES)
    if suite:
        raise RuntimeError(f"importing {module}'s packages imported the suite's {suite}")
    _reply({"request": "ready", "ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become_child(request)
            return None
        _reply({"request": request["request"], "pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"request": request["request"], "returncode": os.waitstatus_to_exitcode(status)})
    return 0


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _become_child(request: dict[str, Any]) -> None:
    """The process is the run's now: its environment, its files, none of the server's pipes."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # as `python -m` puts it there
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    encoding, _, errors = os.environ.get("PYTHONIOENCODING", "").partition(":")
    encoding = encoding or locale.getpreferredencoding(False)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    # As Python makes them for files (the server's own are pipes to the test).
    sys.stdin = open(0, encoding=encoding, errors=errors or "strict", closefd=False)  # noqa: SIM115
    sys.stdout = _text(1, encoding, errors or "strict", unbuffered=unbuffered)
    sys.stderr = _text(2, encoding, "backslashreplace", line_buffering=True)
    sys.argv = [sys.argv[0], *request["args"]]  # runpy puts the module's path first


def _text(
    fd: int, encoding: str, errors: str, *, line_buffering: bool = False, unbuffered: bool = False
) -> IO[str]:
    binary = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(
        binary,
        encoding,
        errors,
        line_buffering=line_buffering,
        write_through=unbuffered or line_buffering,
    )


if __name__ == "__main__":
    # Started as a script: its folder is first on the path; the checkout is what
    # `python -m` from it would put there.
    sys.path[0] = os.getcwd()
    served = sys.argv[1]
    code = _serve(served)
    if code is None:  # the forked child: run the module as `python -m` does, then exit normally
        runpy.run_module(served, run_name="__main__", alter_sys=True)
        sys.exit(0)
    sys.exit(code)
