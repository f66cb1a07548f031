"""SyncActionRunner is ActionRunner, blocking: every member, every argument, every answer.

API.md: ``SyncActionRunner(ledger, **same options)`` offers every
``ActionRunner`` method as a blocking call. A facade that dropped an option
(a caller's retry policy, metadata, an operator's name in the audit) would
still pass every test that runs with defaults, so these hand each argument
a value of its own and check that the async runner received exactly it.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

import dataoad._sync as sync_module
from dataoad import (
    ActionRunner,
    DataoadError,
    InMemoryLedger,
    InvalidArgumentError,
    SyncActionRunner,
)

#: ActionRunner's verbs; each has a blocking twin of the same name.
VERBS = [
    name
    for name, member in inspect.getmembers(ActionRunner, inspect.iscoroutinefunction)
    # Not mutmut's copies of a verb ("xǁActionRunnerǁexecute__mutmut_1"):
    # under a mutation run they are members too, and no twin has them.
    if not name.startswith("_") and name.isascii()
]
#: ActionRunner's read-only properties.
PROPERTIES = [
    name
    for name, member in inspect.getmembers(ActionRunner, lambda m: isinstance(m, property))
    if not name.startswith("_")
]


class _Marker:
    """A value that stands only for itself (compared by identity)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


def _arguments(function: Callable[..., Any]) -> tuple[list[Any], dict[str, Any]]:
    """A distinct marker for every parameter but self: positional ones by position."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if name == "self":
            continue
        if parameter.kind is parameter.KEYWORD_ONLY:
            kwargs[name] = _Marker(name)
        else:
            args.append(_Marker(name))
    return args, kwargs


def _received(function: Callable[..., Any], args: Any, kwargs: Any) -> dict[str, Any]:
    """What each parameter of ``function`` was given (defaults filled in)."""
    bound = inspect.signature(function).bind(None, *args, **kwargs)
    bound.apply_defaults()
    return {name: value for name, value in bound.arguments.items() if name != "self"}


class _Recorder:
    """Stands in for the ActionRunner a SyncActionRunner builds; records every call."""

    built: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.built.append(_received(ActionRunner.__init__, args, kwargs))
        self.ledger = args[0]
        self.calls: list[tuple[str, dict[str, Any], _Marker]] = []

    def __getattr__(self, name: str) -> Any:
        if name not in VERBS:
            raise AttributeError(name)

        async def verb(*args: Any, **kwargs: Any) -> _Marker:
            answer = _Marker(f"{name}'s answer")
            self.calls.append((name, _received(getattr(ActionRunner, name), args, kwargs), answer))
            return answer

        return verb


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> type[_Recorder]:
    monkeypatch.setattr(_Recorder, "built", [])
    monkeypatch.setattr(sync_module, "ActionRunner", _Recorder)
    return _Recorder


def test_the_verbs_and_properties_are_the_ones_api_md_names() -> None:
    # The lists the other tests walk are read from ActionRunner: not empty, not stale.
    assert {"execute", "reconcile", "recover_pending", "recover_stale", "receipt"} <= set(VERBS)
    assert {"reopen", "release_unstarted"} <= set(VERBS)
    assert {"ledger", "policy", "owner", "lease", "namespace"} <= set(PROPERTIES)


def test_the_constructor_takes_actionrunners_options_with_the_same_defaults() -> None:
    assert inspect.signature(SyncActionRunner.__init__).parameters == (
        inspect.signature(ActionRunner.__init__).parameters
    )


def test_the_constructor_hands_every_option_on_unchanged(recorded: type[_Recorder]) -> None:
    args, kwargs = _arguments(SyncActionRunner.__init__)
    runner = SyncActionRunner(*args, **kwargs)
    try:
        assert recorded.built == [_received(ActionRunner.__init__, args, kwargs)]
        assert all(type(value) is _Marker for value in recorded.built[0].values())
    finally:
        runner.close()


def _required(function: Callable[..., Any]) -> tuple[list[Any], dict[str, Any]]:
    """Markers for the parameters without a default only."""
    args, kwargs = _arguments(function)
    parameters = inspect.signature(function).parameters
    required = [
        value for value in args if parameters[value.name].default is inspect.Parameter.empty
    ]
    return required, {
        name: value
        for name, value in kwargs.items()
        if parameters[name].default is inspect.Parameter.empty
    }


def _called_through(
    verb: str, args: list[Any], kwargs: dict[str, Any]
) -> tuple[Any, tuple[str, dict[str, Any], _Marker]]:
    """The blocking ``verb``'s answer, and the one call its (recording) async runner got."""
    runner = SyncActionRunner(InMemoryLedger())
    try:
        answer = getattr(runner, verb)(*args, **kwargs)
        inner = runner.runner
        assert isinstance(inner, _Recorder)
        [call] = inner.calls
        return answer, call
    finally:
        runner.close()


def test_the_constructor_leaves_each_default_to_actionrunner(recorded: type[_Recorder]) -> None:
    args, kwargs = _required(SyncActionRunner.__init__)
    runner = SyncActionRunner(*args, **kwargs)
    try:
        assert recorded.built == [_received(ActionRunner.__init__, args, kwargs)]
    finally:
        runner.close()


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_leaves_each_default_to_actionrunner(
    recorded: type[_Recorder], verb: str
) -> None:
    # Called with only what it requires, the async verb sees its own defaults
    # (the signatures' equality is checked apart: a wrapper can hide a default).
    args, kwargs = _required(getattr(SyncActionRunner, verb))
    _, (_, received, _) = _called_through(verb, args, kwargs)
    assert received == _received(getattr(ActionRunner, verb), args, kwargs)


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_has_a_blocking_twin_with_the_same_parameters(verb: str) -> None:
    assert not inspect.iscoroutinefunction(getattr(SyncActionRunner, verb))
    assert inspect.signature(getattr(SyncActionRunner, verb)).parameters == (
        inspect.signature(getattr(ActionRunner, verb)).parameters
    )


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_hands_every_argument_on_and_returns_the_answer(
    recorded: type[_Recorder], verb: str
) -> None:
    args, kwargs = _arguments(getattr(SyncActionRunner, verb))
    answer, (name, received, given) = _called_through(verb, args, kwargs)
    assert name == verb
    assert received == _received(getattr(ActionRunner, verb), args, kwargs)
    assert all(type(value) is _Marker for value in received.values())
    # A verb that answers hands the answer back; one that returns None returns None.
    expected = inspect.signature(getattr(ActionRunner, verb)).return_annotation
    assert answer is (None if expected in (None, "None") else given)


@pytest.mark.parametrize("name", PROPERTIES)
def test_each_property_is_the_async_runners(name: str) -> None:
    ledger = InMemoryLedger()
    options: dict[str, Any] = {"owner": "worker-7", "lease": 12.5, "namespace": "shop"}
    with SyncActionRunner(ledger, **options) as runner:
        assert getattr(runner, name) == getattr(runner.runner, name)
        if name in options:
            assert getattr(runner, name) == options[name]
    assert runner.ledger is ledger


@pytest.mark.parametrize("timeout", [0, 0.0, 1, 86_400, 86_400.0])
def test_close_takes_a_timeout_from_zero_to_a_day(timeout: float) -> None:
    runner = SyncActionRunner(InMemoryLedger())
    runner.close(timeout)
    with pytest.raises(DataoadError, match=r"^this SyncActionRunner is closed$"):
        runner.receipt("a")


@pytest.mark.parametrize("timeout", [-0.001, -1, 86_400.001, 86_401, True, "1", None, 1e400])
def test_close_refuses_any_other_timeout_and_stays_open(timeout: Any) -> None:
    runner = SyncActionRunner(InMemoryLedger())
    try:
        with pytest.raises(InvalidArgumentError) as info:
            runner.close(timeout)
        assert str(info.value) == f"timeout must be seconds in [0, 86400], not {timeout!r}"
        # Nothing began: calls are still taken.
        result = runner.execute("charge", lambda: "ok", request={}, idempotency_key="k")
        assert result.value == "ok"
    finally:
        runner.close()


class _HeldCall:
    """A call running in another thread, held inside its operation until released."""

    def __init__(self, runner: SyncActionRunner) -> None:
        self.release = threading.Event()
        self.outcome: list[Any] = []
        inside = threading.Event()

        def slow() -> str:
            inside.set()
            assert self.release.wait(10)
            return "done"

        self.caller = threading.Thread(
            target=lambda: self.outcome.append(
                runner.execute("charge", slow, request={}, idempotency_key="slow")
            )
        )
        self.caller.start()
        assert inside.wait(10)

    def end(self) -> Any:
        """Release the call; its result."""
        self.release.set()
        self.caller.join(10)
        return self.outcome[0]


def test_close_while_a_call_runs_refuses_new_calls_then_closes_once_it_ends() -> None:
    runner = SyncActionRunner(InMemoryLedger())
    held = _HeldCall(runner)
    try:
        with pytest.raises(DataoadError) as info:
            runner.close(timeout=0)
        assert str(info.value) == (
            "1 call(s) of this SyncActionRunner are still running after 0 s; the ledger stays "
            "open so they can record their outcomes (new calls are refused). "
            "Call close() again later"
        )
        with pytest.raises(DataoadError, match=r"^this SyncActionRunner is closing: it takes"):
            runner.receipt("a")
    finally:
        result = held.end()
    assert result.value == "done"  # the call in flight recorded its outcome
    runner.close()
    with pytest.raises(DataoadError, match=r"^this SyncActionRunner is closed$"):
        runner.receipt("a")


def test_close_from_inside_one_of_its_own_calls_says_why() -> None:
    runner = SyncActionRunner(InMemoryLedger())
    seen: list[BaseException] = []

    def closes() -> str:
        try:
            runner.close()
        except DataoadError as exc:
            seen.append(exc)
        return "ok"

    try:
        runner.execute("charge", closes, request={}, idempotency_key="k")
        assert [str(e) for e in seen] == [
            "SyncActionRunner.close() was called from inside one of its own calls; it would "
            "wait for itself. Close it after the call returns"
        ]
    finally:
        runner.close()


async def test_a_call_from_a_running_loop_is_refused_with_the_way_out() -> None:
    runner = SyncActionRunner(InMemoryLedger())
    try:
        with pytest.raises(DataoadError) as info:
            runner.receipt("a")
        assert str(info.value) == (
            "SyncActionRunner was called from inside a running event loop; it would block "
            "that loop. Use ActionRunner and await it instead"
        )
    finally:
        runner.close()


def test_its_loop_runs_on_a_named_thread() -> None:
    before = set(threading.enumerate())
    runner = SyncActionRunner(InMemoryLedger())
    try:
        [started] = set(threading.enumerate()) - before
        assert started.name == "dataoad-sync-runner"
        assert started.daemon
    finally:
        runner.close()
    assert not started.is_alive()


def test_a_runner_never_closed_does_not_keep_the_process_alive() -> None:
    # Its loop thread is a daemon: a script that forgets close() still exits.
    script = (
        "from dataoad import InMemoryLedger, SyncActionRunner\n"
        "runner = SyncActionRunner(InMemoryLedger())\n"
        "print(runner.execute('a', lambda: 'ok', request={}, idempotency_key='k').value)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr


def test_close_inside_a_nested_call_still_knows_it_is_inside_one() -> None:
    # A sync operation runs on its caller's thread, so it may call the runner
    # again: after that inner call returns, the thread still waits on the outer
    # one, and a close() there must refuse rather than wait for itself.
    runner = SyncActionRunner(InMemoryLedger())
    seen: list[str] = []

    def outer() -> str:
        inner = runner.execute("inner", lambda: "in", request={}, idempotency_key="inner")
        seen.append(inner.value)
        try:
            runner.close(timeout=5)
        except DataoadError as exc:
            seen.append(str(exc))
        return "out"

    try:
        assert runner.execute("outer", outer, request={}, idempotency_key="outer").value == "out"
        assert seen == [
            "in",
            "SyncActionRunner.close() was called from inside one of its own calls; it would "
            "wait for itself. Close it after the call returns",
        ]
        # Both calls left: close() from here finds nothing in flight.
        runner.close(timeout=0)
    finally:
        runner.close()


def test_close_waits_within_its_timeout_for_a_call_to_record_its_outcome() -> None:
    runner = SyncActionRunner(InMemoryLedger())
    held = _HeldCall(runner)
    # Released a moment after close() begins: a timeout under a second still waits.
    threading.Timer(0.05, held.release.set).start()
    runner.close(timeout=0.99)
    assert held.end().value == "done"
    with pytest.raises(DataoadError, match=r"^this SyncActionRunner is closed$"):
        runner.receipt("a")
