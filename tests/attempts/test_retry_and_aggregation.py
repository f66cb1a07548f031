"""Retry policy and evidence aggregation across attempts (seed: Retry policy)."""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import pytest

from dataoad import (
    ActionResult,
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    EventKind,
    InMemoryLedger,
    InvalidArgumentError,
    RetryPolicy,
    VerificationResult,
)
from suite_support import (
    REF,
    REQUEST,
    CountingOperation,
    Recorder,
    confirmed,
    events,
    fenced_absent,
    fixed_verifier,
)

FAILED, UNKNOWN, CONFIRMED = ActionStatus.FAILED, ActionStatus.UNKNOWN, ActionStatus.CONFIRMED
RETRY_FAILED = RetryPolicy(max_attempts=3, retry_on_failed=True)


async def execute(
    op: CountingOperation, *, policy: RetryPolicy | None = None, **kw: Any
) -> ActionResult[Any]:
    runner = ActionRunner(InMemoryLedger())
    return await runner.execute(
        "charge", op, request=REQUEST, idempotency_key="k", policy=policy, **kw
    )


# -- RetryPolicy ---------------------------------------------------------------


def test_default_policy_is_one_attempt_and_no_retries() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.retry_on_failed, policy.retry_on_unknown) == (
        1,
        False,
        False,
    )
    for status in ActionStatus:
        assert policy.should_retry(status, 1, True) is False


def test_failed_is_retried_only_with_capacity_flag_and_retryable_evidence() -> None:
    assert RETRY_FAILED.should_retry(FAILED, 1, True) is True
    assert RETRY_FAILED.should_retry(FAILED, 1, False) is False  # not retryable evidence
    assert RETRY_FAILED.should_retry(FAILED, 3, True) is False  # no capacity left
    no_flag = RetryPolicy(max_attempts=3)
    assert no_flag.should_retry(FAILED, 1, True) is False
    assert RETRY_FAILED.should_retry(UNKNOWN, 1, True) is False
    assert RETRY_FAILED.should_retry(CONFIRMED, 1, True) is False


def test_retry_on_unknown_works_but_warns() -> None:
    with pytest.warns(RuntimeWarning, match="duplicate"):
        policy = RetryPolicy(max_attempts=2, retry_on_unknown=True)
    assert policy.should_retry(UNKNOWN, 1, False) is True
    assert policy.should_retry(UNKNOWN, 2, False) is False


@pytest.mark.parametrize(
    ("status", "attempts", "retryable"),
    [
        ("FAILED", 1, True),  # a str is not a status
        (None, 1, True),
        (FAILED, True, True),  # True is not an attempt count
        (FAILED, 1.0, True),
        (FAILED, 0, True),
        (FAILED, -1, True),
        (FAILED, 1, 1),  # 1 is not a bool
        (FAILED, 1, "yes"),
        (FAILED, 1, None),
    ],
)
def test_should_retry_validates_exact_types(
    status: object, attempts: object, retryable: object
) -> None:
    with pytest.raises(InvalidArgumentError):
        RETRY_FAILED.should_retry(status, attempts, retryable)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": True},
        {"max_attempts": 2.0},
        {"retry_on_failed": 1},
        {"retry_on_unknown": "no"},
    ],
)
def test_retry_policy_rejects_invalid_fields(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


# -- the runner applies the policy --------------------------------------------


async def test_default_policy_never_retries_failed_or_unknown() -> None:
    for first in (DefinitiveFailure("no", retryable=True), TimeoutError()):
        op = CountingOperation(first, "ok")
        result = await execute(op)
        assert op.calls == 1
        assert result.status in (FAILED, UNKNOWN)


async def test_retryable_definitive_failure_is_retried_when_policy_allows() -> None:
    op = CountingOperation(DefinitiveFailure("busy", retryable=True), "ok")
    result = await execute(op, policy=RETRY_FAILED)
    assert op.calls == 2
    assert result.status is CONFIRMED
    records = result.receipt.attempt_records
    assert [r.execution_status for r in records] == [FAILED, CONFIRMED]
    assert [r.retry_decision for r in records] == ["retry", "stop"]
    assert result.receipt.attempts == 2


async def test_non_retryable_definitive_failure_is_not_retried() -> None:
    op = CountingOperation(DefinitiveFailure("declined"), "ok")
    result = await execute(op, policy=RETRY_FAILED)
    assert op.calls == 1
    assert result.status is FAILED


async def test_a_failure_whose_retryable_flag_cannot_be_read_is_not_retried() -> None:
    class Unreadable(DefinitiveFailure):
        @property
        def retryable(self) -> bool:
            raise RuntimeError("flag lookup failed")

        @retryable.setter
        def retryable(self, value: bool) -> None:
            pass  # set by DefinitiveFailure.__init__; reading it is what fails

    op = CountingOperation(Unreadable("declined"), "ok")
    result = await execute(op, policy=RETRY_FAILED)
    assert op.calls == 1
    assert result.status is FAILED
    assert [r.retry_decision for r in result.receipt.attempt_records] == ["stop"]


async def test_a_retrys_start_is_stamped_with_its_attempts_start() -> None:
    ledger = InMemoryLedger()
    seen: list[tuple[object, object]] = []
    calls = 0

    async def op() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise DefinitiveFailure("busy", retryable=True)
        stored = (await ledger.receipts(pending=True))[0]
        seen.append((stored.updated_at, stored.attempt_records[-1].started_at))
        return "ok"

    await ActionRunner(ledger).execute(
        "charge", op, request=REQUEST, idempotency_key="k", policy=RETRY_FAILED
    )
    ((updated_at, started_at),) = seen
    assert updated_at == started_at


async def test_each_attempt_is_announced_with_the_receipt_that_counts_it() -> None:
    recorder = Recorder()
    op = CountingOperation(DefinitiveFailure("busy", retryable=True), "ok")
    await ActionRunner(InMemoryLedger(), observers=[recorder]).execute(
        "charge", op, request=REQUEST, idempotency_key="k", policy=RETRY_FAILED
    )
    started = recorder.of(EventKind.ATTEMPT_STARTED)
    counted: list[int] = []
    for e in started:
        assert e.receipt is not None
        counted.append(e.receipt.attempts)
    assert counted == [1, 2]


async def test_unknown_is_never_retried_even_when_failed_retries_are_allowed() -> None:
    op = CountingOperation(TimeoutError(), "ok")
    result = await execute(op, policy=RETRY_FAILED)
    assert op.calls == 1
    assert result.status is UNKNOWN


async def test_unknown_absence_without_retry_safe_is_not_retried() -> None:
    op = CountingOperation(TimeoutError(), "ok")
    verifier = fixed_verifier(VerificationResult.absent(verified_provider_reference=REF))
    result = await execute(op, policy=RETRY_FAILED, provider_reference=REF, verifier=verifier)
    assert op.calls == 1
    assert result.status is UNKNOWN


async def test_fenced_absence_authorises_a_retry() -> None:
    op = CountingOperation(TimeoutError(), "ok")
    verifier = fixed_verifier(fenced_absent(), confirmed())
    result = await execute(op, policy=RETRY_FAILED, provider_reference=REF, verifier=verifier)
    assert op.calls == 2
    assert result.status is CONFIRMED


async def test_max_attempts_caps_retries() -> None:
    op = CountingOperation(*[DefinitiveFailure("busy", retryable=True)] * 5)
    result = await execute(op, policy=RETRY_FAILED)
    assert op.calls == 3
    assert result.status is FAILED
    assert result.receipt.attempt_records[-1].retry_decision == "stop"


async def test_retry_on_unknown_escape_hatch_retries_and_warns_each_time() -> None:
    with pytest.warns(RuntimeWarning) as created:
        policy = RetryPolicy(max_attempts=3, retry_on_unknown=True)
    assert len(created) == 1

    op = CountingOperation(TimeoutError(), TimeoutError(), "ok")
    with pytest.warns(RuntimeWarning, match="duplicate") as retried:
        result = await execute(op, policy=policy)
    assert op.calls == 3
    assert result.status is CONFIRMED
    # One warning per retry, not one per call: two retries, two warnings.
    assert len([w for w in retried if "duplicate" in str(w.message)]) == 2


async def test_the_retry_warning_points_at_the_line_that_called_execute() -> None:
    """The warning names the caller's own line (``stacklevel``), where the policy is used."""
    import inspect
    import os

    if "MUTANT_UNDER_TEST" in os.environ:
        pytest.skip("mutmut's trampolines add stack frames: no stacklevel is right under them")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        policy = RetryPolicy(max_attempts=2, retry_on_unknown=True)
    runner = ActionRunner(InMemoryLedger())
    op = CountingOperation(TimeoutError(), "ok")
    line = inspect.currentframe().f_lineno + 3  # type: ignore[union-attr]
    with warnings.catch_warnings(record=True) as retried:
        warnings.simplefilter("always")
        await runner.execute("a", op, request={}, idempotency_key="k", policy=policy)
    (warning,) = [w for w in retried if "duplicate" in str(w.message)]
    assert (warning.filename, warning.lineno) == (__file__, line)


# -- aggregation ----------------------------------------------------------------


async def test_later_failed_attempt_cannot_erase_earlier_unknown() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        policy = RetryPolicy(max_attempts=2, retry_on_unknown=True)

    op = CountingOperation(TimeoutError(), DefinitiveFailure("declined"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = await execute(op, policy=policy)
    assert op.calls == 2
    assert [r.execution_status for r in result.receipt.attempt_records] == [UNKNOWN, FAILED]
    assert result.status is UNKNOWN
    assert result.receipt.execution_status is UNKNOWN


async def test_later_authoritative_confirmation_establishes_confirmed() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        policy = RetryPolicy(max_attempts=2, retry_on_unknown=True)

    op = CountingOperation(TimeoutError(), "ok")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = await execute(op, policy=policy)
    assert result.status is CONFIRMED


async def test_all_failed_attempts_aggregate_to_failed() -> None:
    op = CountingOperation(DefinitiveFailure("busy", retryable=True), DefinitiveFailure("declined"))
    result = await execute(op, policy=RETRY_FAILED)
    assert result.status is FAILED


async def test_policy_argument_overrides_runner_default_and_is_validated() -> None:
    runner = ActionRunner(InMemoryLedger(), policy=RETRY_FAILED)
    op = CountingOperation(DefinitiveFailure("busy", retryable=True), "ok")
    result = await runner.execute("a", op, request={}, idempotency_key="k", policy=RetryPolicy())
    assert op.calls == 1
    assert result.status is FAILED
    with pytest.raises(InvalidArgumentError):
        await runner.execute(  # type: ignore[call-overload]
            "a", op, request={}, idempotency_key="k2", policy="retry"
        )
    with pytest.raises(InvalidArgumentError):
        ActionRunner(InMemoryLedger(), policy={"max_attempts": 2})  # type: ignore[arg-type]


async def test_a_retry_is_logged_with_the_status_that_caused_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dataoad import RetryPolicy

    runner = ActionRunner(
        InMemoryLedger(), policy=RetryPolicy(max_attempts=2, retry_on_failed=True)
    )
    op = CountingOperation(DefinitiveFailure("busy", retryable=True), "ok")
    result = await runner.execute("charge", op, request=REQUEST, idempotency_key="k")
    assert result.status is ActionStatus.CONFIRMED
    retrying = [(lvl, f) for e, lvl, f in events(caplog) if e == "retrying"]
    assert len(retrying) == 1
    level, fields = retrying[0]
    assert level == logging.INFO
    assert fields["attempt_status"] == "FAILED"
    assert fields["attempt"] == 1


async def test_an_unknown_retried_through_the_escape_hatch_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import warnings

    from dataoad import RetryPolicy

    caplog.set_level(logging.INFO, logger="dataoad")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        policy = RetryPolicy(max_attempts=2, retry_on_unknown=True)

    runner = ActionRunner(InMemoryLedger(), policy=policy)
    with pytest.warns(RuntimeWarning) as caught:
        await runner.execute(
            "charge",
            CountingOperation(TimeoutError("lost"), "ok"),
            request=REQUEST,
            idempotency_key="k",
        )
    # mutmut's trampolines add stack frames, so only an unmutated run can
    # check where the warning points.
    if "MUTANT_UNDER_TEST" not in os.environ:
        assert caught[0].filename == __file__
    retrying = [(lvl, f) for e, lvl, f in events(caplog) if e == "retrying"]
    assert retrying[0][0] == logging.WARNING
    assert retrying[0][1]["attempt_status"] == "UNKNOWN"
