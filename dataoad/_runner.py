"""ActionRunner: the public verbs, each validated here and delegated.

The protocol itself lives one step per module: ``_attempts`` (claim,
attempt loop), ``_completing`` (writing the outcome), ``_settled`` (the
settled receipt and the value a caller may see), ``_recovery`` (reconcile,
recover, release, a takeover's settlement, the sweep, over one merge loop),
``_leases`` (holding a claim and taking one over), ``_observing`` (verifier
answers), ``_proven`` (the proven-write rule), ``_evidence`` (what the facts
prove) and ``_events`` (one place events are emitted, to the log and to
observers). This module checks arguments before anything touches the
ledger, and reports each verb call to observers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, TypeGuard, TypeVar, overload

from dataoad._arguments import (
    check_clock,
    check_lease,
    check_ledger,
    check_observer_list,
    check_owner,
    check_policy,
    check_text_arg,
    check_wait,
    prepare_call,
)
from dataoad._attempts import execute_once
from dataoad._bounds import (
    DEFAULT_MAX_METADATA_BYTES,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_VERIFIER_TIMEOUT,
    check_bounds,
)
from dataoad._clock import Clock
from dataoad._errors import InvalidArgumentError
from dataoad._events import EventKind, EventSink, RunnerObserver
from dataoad._identity import check_namespace
from dataoad._in_flight import calls_in_flight
from dataoad._leases import DEFAULT_LEASE, Tenure
from dataoad._ledger import Ledger
from dataoad._operator_verbs import OperatorVerbs
from dataoad._policy import RetryPolicy
from dataoad._proven import ProvenLedger
from dataoad._receipt import ActionReceipt
from dataoad._result import ActionResult
from dataoad._retiring import check_lifecycle
from dataoad._verification import AnyVerifier
from dataoad._waiting import until_the_holder_finishes

__all__ = ["ActionRunner"]

T = TypeVar("T")


def _valid(value: object, name: str) -> TypeGuard[str]:
    """Whether ``value`` passes the check of the argument ``name`` (a bounded, storable str)."""
    if not isinstance(value, str):
        return False
    try:
        check_text_arg(name, value)
    except InvalidArgumentError:
        return False
    return True


class _Verb:
    """One public verb call: its event sink, reported to observers when it ends."""

    __slots__ = ("events", "result")

    def __init__(self, events: EventSink) -> None:
        self.events = events
        self.result: Any = None

    def __enter__(self) -> _Verb:
        self.events.emit(EventKind.CALL_STARTED, None)
        calls_in_flight.enter()  # last: __exit__ runs whenever this counted
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        calls_in_flight.leave()
        if exc is not None:
            receipt = getattr(exc, "receipt", None)
            shown = receipt if isinstance(receipt, ActionReceipt) else None
            self.events.emit(EventKind.CALL_FINISHED, shown, error=exc)
        else:
            receipt = getattr(self.result, "receipt", None)
            self.events.emit(EventKind.CALL_FINISHED, receipt, result=self.result)


class ActionRunner(OperatorVerbs):
    """Runs side-effecting operations under durable, evidence-based receipts.

    ``ActionRunner(ledger, policy=RetryPolicy())``. The default policy makes
    one attempt and never retries. The runner never invokes an operation for
    a replay, an in-progress duplicate or a conflicting request, never retries
    an UNKNOWN outcome unless the policy's escape hatch says so, and resolves
    ambiguity only through read-only verifiers bound to the provider reference.
    ``observers`` receive every event (see ``dataoad.integrations.otel``).

    ``lease`` (seconds, default 30): a claim this runner holds stays its own
    that long without renewal, and is renewed while its attempt runs; a
    claim whose lease ran out (its worker died) is taken over by the next
    caller or by ``recover_stale``, never blindly re-invoked. ``lease=None``
    turns leases off (v0.1: a stranded claim waits for an operator).
    ``owner`` names this worker in receipts (default ``host:pid:random``).

    ``namespace`` (default ``""``) scopes every key and every action id this
    runner touches: a key in one namespace never replays, conflicts with or
    blocks a key in another, and a verb by action id finds only receipts of
    this namespace.

    Bounds, each checked before any ledger write or provider call:
    ``max_request_bytes`` (default 1 MiB of canonical request) and
    ``max_metadata_bytes`` (default 64 KiB of metadata JSON) are refused with
    InvalidRequestError beyond them; ``verifier_timeout`` (default 30 s, None
    for no limit) turns a verifier that has not answered by then into no
    evidence (UNKNOWN), never a hang.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        policy: RetryPolicy | None = None,
        lease: float | None = DEFAULT_LEASE,
        owner: str | None = None,
        namespace: str = "",
        clock: Clock | None = None,
        observers: Sequence[RunnerObserver] = (),
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
        verifier_timeout: float | None = DEFAULT_VERIFIER_TIMEOUT,
    ) -> None:
        self._bounds = check_bounds(max_request_bytes, max_metadata_bytes, verifier_timeout)
        scope = check_namespace(namespace)
        assert scope is not None
        self._store = ProvenLedger(check_ledger(ledger), scope)
        self._policy = check_policy(policy)
        self._clock = check_clock(clock)
        self._observers = check_observer_list(observers)
        self._tenure = Tenure(check_owner(owner), check_lease(lease, ledger), self._clock)

    @property
    def ledger(self) -> Ledger:
        """The ledger this runner records receipts in."""
        return self._store.ledger

    @property
    def policy(self) -> RetryPolicy:
        """The default retry policy for ``execute``."""
        return self._policy

    @property
    def owner(self) -> str:
        """This worker's name in the receipts it claims."""
        return self._tenure.owner

    @property
    def lease(self) -> float | None:
        """Seconds a claim stays this runner's without renewal (None: no leases)."""
        return self._tenure.lease

    def _verb(self, verb: str, *, action_name: object = None, action_id: object = None) -> _Verb:
        # Observers hear of the call before its arguments are checked: only a
        # name or id the checks would take reaches them (a span name, a metric
        # series), never a bad argument echoed, however long or whatever it holds.
        name = action_name if _valid(action_name, "action_name") else None
        ident = action_id if _valid(action_id, "action_id") else None
        return _Verb(EventSink(self._observers, verb, name, ident))

    @overload
    async def execute(
        self,
        action_name: str,
        operation: Callable[[], Awaitable[T]],
        *,
        request: dict[str, Any],
        idempotency_key: str,
        provider_reference: str | None = ...,
        verifier: AnyVerifier | None = ...,
        risk: str | None = ...,
        metadata: dict[str, Any] | None = ...,
        policy: RetryPolicy | None = ...,
        wait_in_progress: float | None = ...,
        expires_after: float | None = ...,
    ) -> ActionResult[T]: ...

    @overload
    async def execute(
        self,
        action_name: str,
        operation: Callable[[], T],
        *,
        request: dict[str, Any],
        idempotency_key: str,
        provider_reference: str | None = ...,
        verifier: AnyVerifier | None = ...,
        risk: str | None = ...,
        metadata: dict[str, Any] | None = ...,
        policy: RetryPolicy | None = ...,
        wait_in_progress: float | None = ...,
        expires_after: float | None = ...,
    ) -> ActionResult[T]: ...

    async def execute(
        self,
        action_name: str,
        operation: Callable[[], Any],
        *,
        request: dict[str, Any],
        idempotency_key: str,
        provider_reference: str | None = None,
        verifier: AnyVerifier | None = None,
        risk: str | None = None,
        metadata: dict[str, Any] | None = None,
        policy: RetryPolicy | None = None,
        wait_in_progress: float | None = None,
        expires_after: float | None = None,
    ) -> ActionResult[Any]:
        """Run ``operation`` at most as often as the policy and evidence allow.

        Raises ActionInProgressError, IdempotencyConflictError and
        ActionPersistenceError as documented, and InvalidArgumentError (or its
        relatives) for bad arguments before any ledger access. Every other
        outcome, provider exceptions included, is returned as an ActionResult.

        ``wait_in_progress`` (seconds): when another caller holds the claim,
        wait up to that long for it to complete and return its receipt as a
        replay, instead of raising ActionInProgressError at once. Waiting never
        invokes the operation for the other caller's claim; if that claim is
        released unstarted, this call claims the key like any new caller.

        ``expires_after`` (seconds): a CONFIRMED or FAILED receipt of the key
        that the ledger stored at least that long ago, judged by the ledger's
        own clock (never this host's), no longer replays; this call
        frees the key (the old receipt stays readable by its id) and claims
        it afresh, and of several callers doing so exactly one claim wins.
        UNKNOWN and PENDING receipts never expire.
        """
        with self._verb("execute", action_name=action_name) as verb:
            call = prepare_call(
                action_name,
                operation,
                request=request,
                idempotency_key=idempotency_key,
                provider_reference=provider_reference,
                verifier=verifier,
                risk=risk,
                metadata=metadata,
                policy=policy,
                default_policy=self._policy,
                namespace=self._store.namespace,
                expires_after=expires_after,
                bounds=self._bounds,
            )
            if call.expires_after is not None:
                check_lifecycle(self._store.ledger, "expire receipts")
            wait = check_wait(wait_in_progress)

            async def look() -> ActionResult[Any]:
                return await execute_once(self._store, call, verb.events, self._tenure)

            verb.result = await until_the_holder_finishes(look, wait, self._clock)
            return verb.result  # type: ignore[no-any-return]

    async def receipt(self, action_id: str) -> ActionReceipt:
        """The stored receipt for ``action_id``; ActionNotFoundError if none."""
        check_text_arg("action_id", action_id)
        return await self._store.read(action_id)
