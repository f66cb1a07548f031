"""Checks of the runner's arguments, all made before the ledger is touched.

Every function here raises ``InvalidArgumentError`` (or a relative) with a
message naming the argument, and has no other effect.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from dataoad._attempts import Call
from dataoad._bounds import DEFAULT_MAX_METADATA_BYTES, Bounds
from dataoad._canonical import checked_request_hash, validate_metadata
from dataoad._clock import Clock, SystemClock
from dataoad._errors import InvalidArgumentError, InvalidRequestError
from dataoad._events import RunnerObserver, check_observers
from dataoad._frozen import FrozenDict, freeze
from dataoad._identity import check_key_size
from dataoad._leases import default_owner
from dataoad._ledger import Ledger
from dataoad._ledger_arguments import checked_lease
from dataoad._lifecycle import check_expires_after
from dataoad._observing import resolve_verifier
from dataoad._policy import RetryPolicy
from dataoad._proven import keeps_leases
from dataoad._verification import MAX_IDENTIFIER_LENGTH, check_stored_text

__all__ = [
    "EXECUTE_OPTIONS",
    "MAX_TEXT_ARG_LENGTH",
    "MAX_WAIT_IN_PROGRESS",
    "check_clock",
    "check_lease",
    "check_ledger",
    "check_metadata",
    "check_observer_list",
    "check_owner",
    "check_policy",
    "check_text_arg",
    "check_wait",
    "prepare_call",
]

#: ``execute``'s options beyond its action, operation, request and key, declared
#: once: every front end (``SyncActionRunner``, ``guarded``, ``run_tool`` and
#: ``GuardedTool``, the engine steps) takes each of them or says why not, and
#: ``tests/front_ends/test_execute_options.py`` compares them all with this.
EXECUTE_OPTIONS: Final = (
    "provider_reference",
    "verifier",
    "risk",
    "metadata",
    "policy",
    "wait_in_progress",
    "expires_after",
)

#: Longest accepted ``wait_in_progress``, in seconds.
MAX_WAIT_IN_PROGRESS: Final = 3600.0

#: Longest accepted identity strings, in characters. Every backend must be able
#: to index the key ``(namespace, action_name, idempotency_key)`` in one unique
#: index; ``_identity`` bounds the three together in bytes.
MAX_TEXT_ARG_LENGTH: Final[dict[str, int]] = {
    "action_name": 128,
    "idempotency_key": 512,
    "provider_reference": MAX_IDENTIFIER_LENGTH,
    "risk": 128,
    "action_id": 128,
    "owner": 200,
}

_LEDGER_METHODS: Final = ("claim", "get", "find", "start_attempt", "record", "release")


def check_text_arg(name: str, value: object, *, optional: bool = False) -> None:
    """A storable, bounded string (or None when ``optional``)."""
    check_stored_text(name, value, limit=MAX_TEXT_ARG_LENGTH[name], optional=optional)


def check_ledger(ledger: object) -> Ledger:
    """An object with every method of the Ledger protocol."""
    missing = [name for name in _LEDGER_METHODS if not callable(getattr(ledger, name, None))]
    if missing:
        raise InvalidArgumentError(
            f"ledger {type(ledger).__qualname__} does not implement the Ledger "
            f"protocol (missing {', '.join(missing)})"
        )
    return ledger  # type: ignore[return-value]


def check_lease(lease: object, ledger: object) -> float | None:
    """None, or finite seconds in (0, MAX_LEASE] on a ledger that keeps leases."""
    seconds = checked_lease(lease)
    if seconds is not None and not keeps_leases(ledger):
        raise InvalidArgumentError(
            f"ledger {type(ledger).__qualname__} keeps no leases (no take_over and renew); "
            "pass lease=None to run without them"
        )
    return seconds


def check_owner(owner: object) -> str:
    """This worker's name in receipts; None gives ``host:pid:random``."""
    if owner is None:
        return default_owner()
    check_text_arg("owner", owner)  # refuses the empty string too
    return owner  # type: ignore[return-value]


def check_policy(policy: object, default: RetryPolicy | None = None) -> RetryPolicy:
    """A RetryPolicy itself (no subclass can loosen its rules); None gives ``default``."""
    if policy is None:
        return default if default is not None else RetryPolicy()
    if type(policy) is not RetryPolicy:
        raise InvalidArgumentError(f"policy must be a RetryPolicy, not {type(policy).__qualname__}")
    return policy


def check_clock(clock: object) -> Clock:
    """A Clock; None gives the system clock."""
    if clock is None:
        return SystemClock()
    if not isinstance(clock, Clock):
        raise InvalidArgumentError(
            "clock must have monotonic() and an async sleep(seconds), "
            f"not {type(clock).__qualname__}"
        )
    return clock


def check_observer_list(observers: object) -> tuple[RunnerObserver, ...]:
    """A sequence of objects with ``on_event(event)``."""
    if isinstance(observers, (str, bytes)) or not hasattr(observers, "__iter__"):
        raise InvalidArgumentError(
            f"observers must be a sequence of observers, not {type(observers).__qualname__}"
        )
    try:
        return check_observers(observers)
    except TypeError as exc:
        raise InvalidArgumentError(str(exc)) from None


def check_metadata(
    metadata: dict[str, Any] | None, max_bytes: int = DEFAULT_MAX_METADATA_BYTES
) -> Mapping[str, Any]:
    """A frozen snapshot of valid caller metadata, at most ``max_bytes`` as JSON."""
    if metadata is None:
        return FrozenDict()
    validate_metadata(metadata)
    if metadata:
        size = len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())
        if size > max_bytes:
            raise InvalidRequestError(
                f"metadata is {size} bytes as JSON, over this runner's "
                f"max_metadata_bytes={max_bytes}: it is stored and rewritten with every "
                "transition of the receipt",
                path="metadata",
            )
    # Snapshot now, so later changes by the caller cannot alter the receipt.
    return freeze(metadata)  # type: ignore[no-any-return]


def check_wait(wait_in_progress: object) -> float | None:
    """None, or finite seconds within [0, MAX_WAIT_IN_PROGRESS]."""
    if wait_in_progress is None:
        return None
    if (
        type(wait_in_progress) not in (int, float)
        or not math.isfinite(wait_in_progress)  # type: ignore[arg-type]
        or not 0 <= wait_in_progress <= MAX_WAIT_IN_PROGRESS  # type: ignore[operator]
    ):
        raise InvalidArgumentError(
            f"wait_in_progress must be None or seconds in [0, {MAX_WAIT_IN_PROGRESS}], "
            f"not {wait_in_progress!r}"
        )
    return float(wait_in_progress)  # type: ignore[arg-type]


def prepare_call(
    action_name: object,
    operation: object,
    *,
    request: object,
    idempotency_key: object,
    provider_reference: object,
    verifier: object,
    risk: object,
    metadata: dict[str, Any] | None,
    policy: object,
    default_policy: RetryPolicy,
    namespace: str,
    expires_after: object,
    bounds: Bounds,
) -> Call:
    """Every ``execute`` argument checked, in the order documented, and the request hashed."""
    check_text_arg("action_name", action_name)
    if not callable(operation):
        raise InvalidArgumentError(
            f"operation must be callable, not {type(operation).__qualname__}"
        )
    digest = checked_request_hash(request, bounds.max_request_bytes)
    check_text_arg("idempotency_key", idempotency_key)
    check_key_size(namespace, action_name, idempotency_key)  # type: ignore[arg-type]
    check_text_arg("provider_reference", provider_reference, optional=True)
    verify = None if verifier is None else resolve_verifier(verifier, bounds.verifier_timeout)
    if verify is not None and provider_reference is None:
        raise InvalidArgumentError(
            "a verifier needs provider_reference: verification must be bound to the "
            "provider's own reference for this mutation"
        )
    check_text_arg("risk", risk, optional=True)
    caller_metadata = check_metadata(metadata, bounds.max_metadata_bytes)
    checked_policy = check_policy(policy, default_policy)
    expiry = check_expires_after(expires_after)
    return Call(
        action_name=action_name,  # type: ignore[arg-type]
        operation=operation,
        idempotency_key=idempotency_key,  # type: ignore[arg-type]
        digest=digest,
        provider_reference=provider_reference,  # type: ignore[arg-type]
        verify=verify,
        risk=risk,  # type: ignore[arg-type]
        metadata=caller_metadata,
        policy=checked_policy,
        expires_after=expiry,
    )
