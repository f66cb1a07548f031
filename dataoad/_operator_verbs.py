"""The runner's operator verbs: settle, recover, sweep, reopen and release, each audited.

None of them ever invokes an operation. ``ActionRunner`` inherits them; they
use its ledger door, bounds, tenure and verb bookkeeping. Each but
``reconcile`` (an application's own read-back) leaves its operator record.
"""

from __future__ import annotations

from typing import Any

from dataoad._arguments import check_text_arg
from dataoad._auditing import OperatorStamp, audited
from dataoad._bounds import Bounds
from dataoad._errors import InvalidArgumentError
from dataoad._leases import Tenure
from dataoad._observing import resolve_verifier
from dataoad._proven import ProvenLedger
from dataoad._recovery import reconcile, recover_pending, recover_stale, release
from dataoad._result import ActionResult
from dataoad._retiring import check_lifecycle, reopen
from dataoad._verification import AnyVerifier

__all__ = ["OperatorVerbs"]


class OperatorVerbs:
    """The read-only settling and lifecycle verbs of ``ActionRunner``."""

    _store: ProvenLedger
    _bounds: Bounds
    _tenure: Tenure

    @property
    def namespace(self) -> str:
        """The namespace this runner's keys and receipts belong to."""
        return self._store.namespace

    def _verb(self, verb: str, *, action_name: object = None, action_id: object = None) -> Any:
        raise NotImplementedError  # ActionRunner's

    async def reconcile(self, action_id: str, verifier: AnyVerifier) -> ActionResult[Any]:
        """Settle a completed UNKNOWN receipt with a read-only verifier.

        A receipt that is already CONFIRMED or FAILED is returned unchanged
        without calling the verifier. A PENDING claim is refused: it may still
        be in flight; use ``recover_pending`` once its worker is known to be gone.
        The operation is never invoked.
        """
        with self._verb("reconcile", action_id=action_id) as verb:
            check_text_arg("action_id", action_id)
            verify = resolve_verifier(verifier, self._bounds.verifier_timeout)
            verb.result = await reconcile(self._store, action_id, verify, verb.events)
            return verb.result  # type: ignore[no-any-return]

    async def recover_pending(
        self,
        action_id: str,
        verifier: AnyVerifier,
        *,
        operator: str | None = None,
        reason: str | None = None,
    ) -> ActionResult[Any]:
        """Complete a stranded PENDING claim (attempts >= 1) from read-only evidence.

        First make sure the original worker can no longer mutate. The claim
        becomes COMPLETED with whatever the verifier proves; inconclusive
        read-back leaves a completed UNKNOWN receipt that ``reconcile`` can
        settle later. A claim that never started an attempt is refused (use
        ``release_unstarted``); a completed claim is reconciled instead.
        The audit records ``operator`` (default: the OS user), ``reason`` and
        the outcome (``ledger.audit()``).
        """
        with self._verb("recover_pending", action_id=action_id) as verb:
            check_text_arg("action_id", action_id)
            verify = resolve_verifier(verifier, self._bounds.verifier_timeout)
            stamp = OperatorStamp.of("recover", operator, reason, self.namespace)
            verb.result = await audited(
                self._store.ledger,
                stamp,
                action_id,
                lambda: recover_pending(self._store, action_id, verify, verb.events),
                _recovered,
            )
            return verb.result  # type: ignore[no-any-return]

    async def recover_stale(
        self,
        verifier: AnyVerifier | None = None,
        *,
        limit: int = 100,
        operator: str | None = None,
        reason: str | None = None,
    ) -> list[ActionResult[Any]]:
        """Settle claims whose lease ran out (their worker is gone), without a person.

        Each is taken over atomically (a worker that renewed in time keeps
        its claim). One that never started an attempt is released; one that
        did is settled read-only: by the verifier's bound evidence, or as
        UNKNOWN without one. Never invokes an operation. Returns the settled
        results (up to ``limit`` claims are looked at). Each released or
        settled claim gets its record in the audit (``operator``, ``reason``).
        """
        with self._verb("recover_stale") as verb:
            verify = (
                None
                if verifier is None
                else resolve_verifier(verifier, self._bounds.verifier_timeout)
            )
            if type(limit) is not int or not 1 <= limit <= 10_000:
                raise InvalidArgumentError(f"limit must be an int in [1, 10000], not {limit!r}")
            stamp = OperatorStamp.of("recover_stale", operator, reason, self.namespace)

            async def note(action_id: str, outcome: str) -> None:
                await stamp.note(self._store.ledger, action_id, outcome)

            verb.result = await recover_stale(
                self._store, verify, self._tenure, verb.events, limit, note
            )
            return verb.result  # type: ignore[no-any-return]

    async def reopen(
        self, action_id: str, *, operator: str | None = None, reason: str | None = None
    ) -> None:
        """Free the key of a definitive FAILED receipt, so it can be claimed afresh.

        The receipt stays readable by its id. RecoveryRefusedError, changing
        nothing, for a CONFIRMED, UNKNOWN or PENDING receipt; atomic against a
        concurrent replay, merge or reconcile (it re-decides on what is
        stored). Reopening a receipt whose key is already free does nothing.
        The audit records ``operator``, ``reason`` and the outcome.
        """
        with self._verb("reopen", action_id=action_id) as verb:
            check_text_arg("action_id", action_id)
            check_lifecycle(self._store.ledger, "reopen receipts")
            stamp = OperatorStamp.of("reopen", operator, reason, self.namespace)
            await audited(
                self._store.ledger,
                stamp,
                action_id,
                lambda: reopen(self._store, action_id, verb.events),
                lambda freed: "reopened" if freed else "already free: nothing changed",
            )

    async def release_unstarted(
        self, action_id: str, *, operator: str | None = None, reason: str | None = None
    ) -> None:
        """Remove a PENDING claim that never started an attempt, so its key can be reused.

        Atomic against attempt start: once invocation may have begun
        (attempts >= 1), or the claim is completed, this raises
        RecoveryRefusedError and changes nothing. The audit records
        ``operator``, ``reason`` and the outcome.
        """
        with self._verb("release_unstarted", action_id=action_id) as verb:
            check_text_arg("action_id", action_id)
            stamp = OperatorStamp.of("release_unstarted", operator, reason, self.namespace)
            await audited(
                self._store.ledger,
                stamp,
                action_id,
                lambda: release(self._store, action_id, verb.events),
                lambda _: "released",
            )


def _recovered(result: ActionResult[Any]) -> str:
    """The audit's outcome of a recovery: what it settled, or that it found it settled."""
    if result.replayed:
        return f"already {result.status.value}: nothing changed"
    return result.status.value
