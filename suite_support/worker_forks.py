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
running). Suite modules (``tests``, ``examples``) are imported by each
child afresh.

    python -m suite_support.worker_forks MODULE   # the server; requests on stdin
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import dataclasses
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
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
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, module],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self._answer(timeout=120.0)
        if ready.get("ready") is not True:
            raise RuntimeError(f"the fork server for {module} did not start: {ready}")

    def _answer(self, timeout: float) -> dict[str, Any]:
        out = self.process.stdout
        assert out is not None
        readable, _, _ = select.select([out], [], [], timeout)
        if not readable:
            raise TimeoutError(f"the fork server for {self.module} did not answer in {timeout} s")
        line = out.readline()
        if not line:
            raise RuntimeError(f"the fork server for {self.module} ended ({self.process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> ForkedRun:
        # One run at a time: a test that wants processes side by side starts
        # them itself (queueing them here would make them take turns unseen).
        if not self.busy.acquire(blocking=False):
            raise RuntimeError(f"{self.module}: one forked run at a time; use subprocess.Popen")
        try:
            return self._run(args, env, cwd, timeout)
        finally:
            self.busy.release()

    def _run(self, args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> ForkedRun:
        stdout, stderr = self.scratch / "stdout", self.scratch / "stderr"
        request = {
            "args": args,
            "env": env,
            "cwd": str(cwd),
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        pid = self._answer(timeout=30.0)["pid"]
        try:
            status = self._answer(timeout=timeout)["returncode"]
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._answer(timeout=30.0)
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


_SERVERS: dict[tuple[str, str], _Server] = {}
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
    key = (module, json.dumps(sorted(shared.items())))
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
    _reply({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become_child(request)
            return None
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"returncode": os.waitstatus_to_exitcode(status)})
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
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - fd 0, kept for the run
    sys.stdout = _text(1)
    sys.stderr = _text(2)
    sys.argv = [sys.argv[0], *request["args"]]  # runpy puts the module's path first


def _text(fd: int) -> IO[str]:
    return open(fd, "w", encoding="utf-8", closefd=False, buffering=1)


if __name__ == "__main__":
    served = sys.argv[1]
    code = _serve(served)
    if code is None:  # the forked child: run the module as `python -m` does, then exit normally
        runpy.run_module(served, run_name="__main__", alter_sys=True)
        sys.exit(0)
    sys.exit(code)
