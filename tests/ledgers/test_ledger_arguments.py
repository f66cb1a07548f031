"""The ledger door's receipt check: its fast path takes every plain receipt itself.

``check_receipt`` judges the common receipt (ASCII text, counts in range,
statuses and times of their exact type) in a few C calls, and only anything
else field by field (``_judged``), which also says what is wrong. The
contract suite (``ArgumentContract``) checks what is refused; these check
that what is plainly valid never pays for the slow path, on both sides of
each bound, and that valid receipts the fast path declines (non-ASCII text)
are still accepted.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from dataoad import ActionStatus, ClaimState, InvalidArgumentError
from dataoad import _ledger_arguments as door
from dataoad._ledger_arguments import (
    MAX_COUNT,
    check_receipt,
    checked_lease,
    checked_text,
    required_lease,
)
from dataoad.testing import make_receipt
from dataoad.testing._contract_receipts import completed, started

_ONE = make_receipt(provider_reference=None, risk=None)


def _plain_receipts() -> list[Any]:
    done = completed(started(make_receipt()), ActionStatus.FAILED)
    return [
        _ONE,  # no provider reference, risk or owner: the optional texts absent
        make_receipt(owner="worker-1"),
        started(make_receipt()),
        done,  # an error, statuses set, COMPLETED
        done.evolve(
            provider_request_id="pr_1", verification_status=ActionStatus.CONFIRMED, error=None
        ),
        make_receipt(attempts=0, version=1, fencing_token=1),  # the low ends
        make_receipt(attempts=MAX_COUNT, version=MAX_COUNT, fencing_token=MAX_COUNT),
        make_receipt(created_at=datetime(2026, 1, 2, tzinfo=timezone(timedelta(hours=-5)))),
        make_receipt(claim_state=ClaimState.COMPLETED, final_status=ActionStatus.UNKNOWN),
        make_receipt(action_id="a", namespace="", idempotency_key="k"),
    ]


@pytest.mark.parametrize("receipt", _plain_receipts())
def test_a_plain_receipt_is_taken_without_the_slow_path(
    receipt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def slow(receipt: Any) -> Any:
        raise AssertionError(f"the slow path judged a plain receipt: {receipt!r}")

    monkeypatch.setattr(door, "_judged", slow)
    assert check_receipt(receipt) is receipt


@pytest.mark.parametrize(
    "changes",
    [
        {"idempotency_key": "clé"},
        {"action_name": "refund ✓"},
        {"error": "TimeoutError: ⏱"},
        {"owner": "wörker"},
    ],
)
def test_valid_text_the_fast_path_declines_is_still_accepted(
    changes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Any] = []
    judged = door._judged

    def counted(receipt: Any) -> Any:
        calls.append(receipt)
        return judged(receipt)

    receipt = make_receipt(**changes)
    monkeypatch.setattr(door, "_judged", counted)
    assert check_receipt(receipt) is receipt
    assert calls == [receipt]


def test_times_in_any_zone_are_accepted_and_naive_ones_named() -> None:
    aware = make_receipt(created_at=datetime(2026, 1, 2, tzinfo=UTC))
    assert check_receipt(aware) is aware
    naive = make_receipt()
    object.__setattr__(naive, "updated_at", datetime(2026, 1, 2))
    with pytest.raises(ValueError, match=r"^updated_at must be a timezone-aware datetime"):
        check_receipt(naive)


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (lambda: checked_lease(-1), "lease must be None or seconds in (0, 86400], not -1"),
        (lambda: required_lease(-1), "lease must be seconds in (0, 86400], not -1"),
        (lambda: required_lease(None), "lease must be seconds in (0, 86400], not None"),
        (
            lambda: checked_text("owner", 5, optional=True),
            "owner must be a string or None, not int",
        ),
        (lambda: checked_text("owner", 5), "owner must be a string, not int"),
        (lambda: checked_text("owner", "a\x00"), "owner must not contain NUL characters"),
        (lambda: checked_text("owner", "a\ud800"), "owner is not valid Unicode (lone surrogate)"),
    ],
)
def test_each_refusal_says_what_was_wanted_and_what_came(check: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        check()
    assert str(refused.value) == message
