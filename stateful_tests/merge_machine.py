"""The verification-merge machine: concurrent observations merged in every order.

One action ends UNKNOWN. Then several ``reconcile`` contenders, each with a
verifier whose answer is drawn (including answers that contradict each
other, as a stale replica and a fresh one might), interleave through the
gate scheduler. However their reads and writes interleave, the receipt must
end as the model's order-independent merge of every observation recorded,
and no observation may be lost (no first- or last-writer-wins).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import dataoad._evidence as evidence_module
from dataoad import (
    ActionReceipt,
    ActionResult,
    ActionRunner,
    ActionStatus,
    InMemoryLedger,
    Ledger,
    SQLiteLedger,
    VerificationHealth,
    VerificationResult,
)
from models.protocol import Evidence, classify_verification, merge
from stateful_tests.harness import (
    Contender,
    GatedLedger,
    History,
    LedgerFault,
    MachineLoop,
    Scheduler,
    violation,
)
from stateful_tests.invariants import evidence_objection
from suite_support.services import PostgresTestTable

REF = "ref-merge"
#: Observations a receipt keeps in this machine (the library's default is higher).
OBSERVATION_LIMIT = 2
ANSWERS: dict[str, tuple[Any, Evidence | None]] = {
    "confirmed pr_1": (
        lambda: VerificationResult.confirmed(
            verified_provider_reference=REF, provider_request_id="pr_1"
        ),
        Evidence("CONFIRMED"),
    ),
    "confirmed pr_2": (
        lambda: VerificationResult.confirmed(
            verified_provider_reference=REF, provider_request_id="pr_2"
        ),
        Evidence("CONFIRMED"),
    ),
    "absent retry-safe": (
        lambda: VerificationResult.absent(verified_provider_reference=REF, retry_safe=True),
        Evidence("FAILED", retry_safe=True),
    ),
    "absent": (
        lambda: VerificationResult.absent(verified_provider_reference=REF),
        Evidence("FAILED"),
    ),
    "unknown": (
        lambda: VerificationResult.unknown(reason="down"),
        Evidence("UNKNOWN", healthy=False),
    ),
    "degraded confirmation": (
        lambda: VerificationResult(
            outcome=ActionStatus.CONFIRMED,
            health=VerificationHealth.DEGRADED,
            verified_provider_reference=REF,
        ),
        Evidence("CONFIRMED", healthy=False),
    ),
    "wrong reference": (
        lambda: VerificationResult.confirmed(verified_provider_reference="elsewhere"),
        Evidence("CONFIRMED", bound=False),
    ),
    # No answer at all: no evidence, so nothing to write on a completed receipt.
    "raises": (lambda: _raise_connection_error(), None),
}
#: What the raising verifier says: a provider's value no receipt may store.
PROVIDER_VALUE = "cus_42"


def _raise_connection_error() -> VerificationResult:
    raise ConnectionError(f"GET /v1/charges?customer={PROVIDER_VALUE}: connection refused")


class MergeMachineBase(RuleBasedStateMachine):
    """Reconcilers race on one UNKNOWN receipt; the model judges the merge."""

    backend: ClassVar[str] = "memory"
    runner_class: ClassVar[type[ActionRunner]] = ActionRunner

    def __init__(self) -> None:
        super().__init__()
        self.loop = MachineLoop()
        self.scheduler = Scheduler(self.loop)
        self.folder = Path(tempfile.mkdtemp(prefix="dataoad-merge-"))
        self.clients: list[Ledger] = []
        self.reconcilers: list[Contender] = []
        self.answers: dict[str, str] = {}
        self.action_id = ""
        self.history = History(type(self).__name__)
        self.postgres: PostgresTestTable | None = None
        # A low bound, so runs reach it: up to five reconcilers write here.
        self.saved_observation_limit = evidence_module.MAX_KEPT_OBSERVATIONS
        evidence_module.MAX_KEPT_OBSERVATIONS = OBSERVATION_LIMIT

    def client(self) -> Ledger:
        if self.backend == "postgres":
            if self.postgres is None:
                self.postgres = PostgresTestTable()
                self.loop.run(self.postgres.create())
            ledger: Ledger = self.postgres.client()
        elif self.backend == "sqlite":
            ledger = SQLiteLedger(self.folder / "merge.sqlite3")
        elif self.clients:
            return self.clients[0]
        else:
            ledger = InMemoryLedger()
        self.clients.append(ledger)
        return ledger

    def teardown(self) -> None:
        try:
            self.scheduler.stop_all(self.reconcilers)
            evidence_module.MAX_KEPT_OBSERVATIONS = self.saved_observation_limit
            for ledger in self.clients:
                self.loop.run(ledger.close())
            if self.postgres is not None:
                self.loop.run(self.postgres.drop())
        finally:
            self.loop.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    @initialize()
    def an_unknown_action(self) -> None:
        async def timeout() -> None:
            raise TimeoutError("response lost")

        result = self.loop.run(
            ActionRunner(self.client()).execute(
                "charge", timeout, request={}, idempotency_key="k", provider_reference=REF
            )
        )
        assert result.status is ActionStatus.UNKNOWN
        self.action_id = result.receipt.action_id

    @precondition(lambda self: len(self.reconcilers) < 5)
    @rule(answer=st.sampled_from(sorted(ANSWERS)))
    def start_reconcile(self, answer: str) -> None:
        name = "RSTUV"[len(self.reconcilers)]
        c = Contender(name, "reconcile", "k", REF)
        self.reconcilers.append(c)
        self.answers[name] = answer
        runner = self.runner_class(GatedLedger(self.client(), self.scheduler))
        make_result = ANSWERS[answer][0]

        async def verify(receipt: Any) -> VerificationResult:
            await self.scheduler.gate("verifier.verify")
            c.verifier_answers.append((None, answer))  # type: ignore[arg-type]
            return make_result()  # type: ignore[no-any-return]

        note(f"reconciler {name} will observe: {answer}")
        self.history.add(f"reconciler {name}", f"starts; its verifier will answer {answer!r}")
        event(f"answer: {answer}")
        self.scheduler.start(c, lambda: runner.reconcile(self.action_id, verify))

    @precondition(lambda self: any(c.parked_at for c in self.reconcilers))
    @rule(data=st.data())
    def advance(self, data: st.DataObject) -> None:
        parked = {c.name: c for c in self.reconcilers if c.parked_at}
        c = parked[data.draw(st.sampled_from(sorted(parked)), label="reconciler")]
        note(f"reconciler {c.name} passes {c.parked_at}")
        gate = c.parked_at
        self.scheduler.release(c, LedgerFault.NONE if c.parked_at != "verifier.verify" else None)
        outcome = ""
        if c.finished:
            result = c.outcome
            outcome = (
                f" and finishes: {result.status.value}, version {result.receipt.version}"
                if isinstance(result, ActionResult)
                else f" and finishes: {type(result).__name__}"
            )
        self.history.add(f"reconciler {c.name}", f"passes {gate}{outcome}")

    @rule()
    def an_operator_reads_the_receipt(self) -> None:
        """Reads change nothing; this rule also keeps the machine able to move on."""
        receipt = self.loop.run(self.clients[0].get(self.action_id))
        assert receipt is not None
        note(f"receipt: {receipt.final_status}, version {receipt.version}")

    def _stored(self) -> ActionReceipt | None:
        """The action's receipt as the ledger holds it (None before the action exists)."""
        if not self.action_id:
            return None
        receipt: ActionReceipt | None = self.loop.run(self.clients[0].get(self.action_id))
        assert receipt is not None
        return receipt

    @invariant()
    def status_permitted_by_recorded_evidence(self) -> None:
        """The receipt's status is one its recorded attempt and observations permit (the evidence oracle)."""
        receipt = self._stored()
        if receipt is None:
            return
        # The action was made without a verifier: its one attempt timed out.
        objection = evidence_objection(receipt, verifier=False)
        if objection is not None:
            raise violation(self.history, "status-permitted-by-recorded-evidence", objection)

    @invariant()
    def merge_is_order_independent_and_loses_nothing(self) -> None:
        """The receipt states the model's merge of every observation, and counts them all."""
        receipt = self._stored()
        if receipt is None:
            return
        recorded = receipt.metadata.get("verification_observations", ())
        counted = receipt.metadata.get("verification_observation_count", 0)
        writers = [
            c
            for c in self.reconcilers
            if c.finished
            and isinstance(c.outcome, ActionResult)
            and c.verifier_answers
            and ANSWERS[self.answers[c.name]][1] is not None
        ]
        no_answer = [o for o in recorded if str(o.get("error") or "").startswith("verifier raised")]
        if no_answer or PROVIDER_VALUE in repr(receipt):
            raise violation(
                self.history,
                "no-answer-is-not-evidence",
                "a verifier that raised left a record on a completed receipt "
                f"({no_answer or 'its message'}); it proves nothing and must write nothing",
            )
        # Only observations nothing depends on may be dropped past the bound;
        # the status and provider-id checks below catch a wrong drop.
        dropped_below_the_bound = counted <= OBSERVATION_LIMIT and len(recorded) != counted
        if counted < len(writers) or dropped_below_the_bound:
            raise violation(
                self.history,
                "every-observation-is-kept",
                f"{len(writers)} reconcilers wrote; the receipt counts {counted} observations "
                f"and keeps {len(recorded)} ({', '.join(self.answers[c.name] for c in writers)})",
            )
        # The newest observation is the receipt's verification: trimming past the
        # bound may drop old ones, never it.
        newest = recorded[-1] if recorded else None
        if newest is not None and (
            newest.get("number") != counted or receipt.metadata.get("verification") != newest
        ):
            raise violation(
                self.history,
                "the-newest-observation-is-kept",
                f"the receipt counts {counted} observations but keeps up to number "
                f"{newest.get('number')} ({[o.get('number') for o in recorded]}), and its "
                "verification is "
                + ("that one" if receipt.metadata.get("verification") == newest else "another"),
            )
        expected, conflict = merge(
            classify_verification(ANSWERS[self.answers[c.name]][1]) for c in writers
        )
        if writers and receipt.final_status.value != (expected or "UNKNOWN"):  # type: ignore[union-attr]
            raise violation(
                self.history,
                "merge-is-order-independent",
                f"observations {[self.answers[c.name] for c in writers]} must merge to "
                f"{expected} (contradiction={conflict}); the receipt says "
                f"{receipt.final_status.value}",  # type: ignore[union-attr]
            )
        ids = {
            "pr_1" if "pr_1" in self.answers[c.name] else "pr_2"
            for c in writers
            if self.answers[c.name].startswith("confirmed")
        }
        if set(receipt.metadata.get("provider_request_ids", ())) != ids:
            raise violation(
                self.history,
                "every-provider-request-id-is-kept",
                f"ids {sorted(ids)} were confirmed, the receipt keeps "
                f"{list(receipt.metadata.get('provider_request_ids', ()))}",
            )
        if len(ids) > 1 and receipt.metadata.get("provider_request_id_conflict") is not True:
            raise violation(
                self.history,
                "every-provider-request-id-is-kept",
                "two ids confirmed without the conflict flag",
            )


MergeMachineMemory: type[MergeMachineBase] = type(
    "MergeMachineMemory", (MergeMachineBase,), {"backend": "memory"}
)
MergeMachineSQLite: type[MergeMachineBase] = type(
    "MergeMachineSQLite", (MergeMachineBase,), {"backend": "sqlite"}
)
MergeMachinePostgres: type[MergeMachineBase] = type(
    "MergeMachinePostgres", (MergeMachineBase,), {"backend": "postgres"}
)
