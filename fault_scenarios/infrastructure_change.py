"""An infrastructure change: a conditional write guarded by an etag.

If the response to a committed change is lost, a retry with the old etag is
refused as a precondition failure, which looks like "failed" although the
change is live. Dataoad records UNKNOWN instead, never retries it, and a
read of the resource settles it.
"""

from __future__ import annotations

from typing import Any

from dataoad import ActionRunner, DefinitiveFailure, Ledger, RetryPolicy, VerificationResult
from dataoad.testing import (
    LedgerFactory,
    SafetyCheck,
    SafetyReport,
    expect,
)
from fault_scenarios._kit import (
    Fault,
    FaultScript,
    RunnerFactory,
    fencing_token,
    run_scenario,
    zombie_and_taker,
)

ACTION = "scale_service"
CHANGE = "chg-2024-11-30-a"
RETRY_FAILED = RetryPolicy(max_attempts=2, retry_on_failed=True)


class FakeConfigStore:
    """One resource with a version etag; writes must name the current etag."""

    def __init__(self, *faults: Fault) -> None:
        self.script = FaultScript(faults)
        self.etag = "v1"
        self.replicas = 2
        self.applied: list[str] = []  # change ids, in order
        self.calls = 0
        #: The highest fencing token seen; writes with an older one are refused.
        self.fence = 0
        self.fenced_refusals = 0

    async def apply(
        self,
        *,
        expected_etag: str,
        replicas: int,
        change_id: str,
        fencing_token: int | None = None,
    ) -> str:
        self.calls += 1
        if fencing_token is not None:
            if fencing_token < self.fence:
                self.fenced_refusals += 1
                raise DefinitiveFailure(
                    f"refused: fencing token {fencing_token} is older than {self.fence}"
                )
            self.fence = fencing_token
        fault = self.script.next()
        if fault is Fault.REFUSED_BEFORE_SEND:
            raise ConnectionRefusedError("control plane unreachable")
        if expected_etag != self.etag:
            raise DefinitiveFailure(
                f"precondition failed: etag is {self.etag}, not {expected_etag}"
            )
        self.replicas = replicas
        self.applied.append(change_id)
        self.etag = f"v{len(self.applied) + 1}"
        if fault is Fault.TIMEOUT_AFTER_COMMIT:
            raise TimeoutError("control plane timed out after applying")
        if fault is Fault.RESET_AFTER_COMMIT:
            raise ConnectionResetError("connection reset after applying")
        return self.etag


class ResourceReader:
    """Reads the resource: the change is there if its id is in the change log."""

    def __init__(self, store: FakeConfigStore) -> None:
        self.store = store

    def verify(self, receipt: Any) -> VerificationResult:
        change = receipt.provider_reference
        # Fence first: a worker whose claim was taken over cannot apply it late.
        self.store.fence = max(self.store.fence, receipt.fencing_token)
        if change in self.store.applied:
            return VerificationResult.confirmed(
                verified_provider_reference=change, provider_request_id=change
            )
        # A refused request never reached the store: nothing can land later.
        return VerificationResult.absent(verified_provider_reference=change, retry_safe=True)


async def scale(runner: ActionRunner, store: FakeConfigStore, etag: str = "v1", **kw: Any) -> Any:
    return await runner.execute(
        ACTION,
        lambda: store.apply(expected_etag=etag, replicas=5, change_id=CHANGE),
        request={"service": "checkout", "replicas": 5, "expected_etag": etag},
        idempotency_key=CHANGE,
        provider_reference=CHANGE,
        risk="infrastructure",
        **kw,
    )


def checks(new_runner: RunnerFactory) -> list[tuple[str, Any]]:
    def observed(result: Any, store: FakeConfigStore) -> dict[str, Any]:
        return {"status": result.status.value, "calls": store.calls, "changes": len(store.applied)}

    async def normal_change(ledger: Ledger) -> SafetyCheck:
        store = FakeConfigStore()
        result = await scale(new_runner(ledger), store)
        return expect(
            "Normal change",
            {"status": "CONFIRMED", "calls": 1, "changes": 1},
            observed(result, store),
        )

    async def lost_response_is_not_retried(ledger: Ledger) -> SafetyCheck:
        store = FakeConfigStore(Fault.TIMEOUT_AFTER_COMMIT)
        result = await scale(new_runner(ledger), store, policy=RETRY_FAILED)
        return expect(
            "Lost response after commit is not retried",
            {"status": "UNKNOWN", "calls": 1, "changes": 1},
            observed(result, store),
        )

    async def lost_response_is_confirmed_by_reading(ledger: Ledger) -> SafetyCheck:
        store = FakeConfigStore(Fault.RESET_AFTER_COMMIT)
        result = await scale(
            new_runner(ledger), store, verifier=ResourceReader(store), policy=RETRY_FAILED
        )
        return expect(
            "Lost response confirmed by reading the resource",
            {"status": "CONFIRMED", "calls": 1, "changes": 1},
            observed(result, store),
        )

    async def stale_etag_is_a_definitive_failure(ledger: Ledger) -> SafetyCheck:
        store = FakeConfigStore()
        result = await scale(new_runner(ledger), store, etag="v0", policy=RETRY_FAILED)
        return expect(
            "Stale etag is a definitive failure",
            {"status": "FAILED", "calls": 1, "changes": 0},
            observed(result, store),
        )

    async def refused_before_send_is_retried(ledger: Ledger) -> SafetyCheck:
        store = FakeConfigStore(Fault.REFUSED_BEFORE_SEND)
        result = await scale(
            new_runner(ledger), store, verifier=ResourceReader(store), policy=RETRY_FAILED
        )
        return expect(
            "Refused before send: verified absent, applied once",
            {"status": "CONFIRMED", "calls": 2, "changes": 1},
            observed(result, store),
        )

    async def zombie_change_is_refused(ledger: Ledger) -> SafetyCheck:
        store = FakeConfigStore()

        async def execute(runner: ActionRunner, before_send: Any) -> Any:
            async def send() -> str:
                etag = store.etag  # read, then the worker may pause before it writes
                await before_send()
                return await store.apply(
                    expected_etag=etag,
                    replicas=5,
                    change_id=CHANGE,
                    fencing_token=fencing_token(),
                )

            return await runner.execute(
                ACTION,
                send,
                request={"service": "checkout", "replicas": 5, "expected_etag": "v1"},
                idempotency_key=CHANGE,
                provider_reference=CHANGE,
                risk="infrastructure",
                verifier=ResourceReader(store),
                policy=RETRY_FAILED,
            )

        taken, zombie = await zombie_and_taker(ledger, new_runner, execute)
        return expect(
            "A paused worker's late change is refused after a takeover",
            {
                "taken_over": True,
                "zombie": "ClaimFencedError",
                "fenced_refusals": 1,
                "status": "CONFIRMED",
                "changes": 1,
            },
            {
                "taken_over": taken.taken_over,
                "zombie": type(zombie).__name__,
                "fenced_refusals": store.fenced_refusals,
                "status": taken.status.value,
                "changes": len(store.applied),
            },
        )

    return [
        ("Normal change", normal_change),
        ("Lost response after commit", lost_response_is_not_retried),
        ("Lost response, read back", lost_response_is_confirmed_by_reading),
        ("Stale etag", stale_etag_is_a_definitive_failure),
        ("Refused before send", refused_before_send_is_retried),
        ("Zombie change after takeover", zombie_change_is_refused),
    ]


async def run_safety_suite(
    ledger_factory: LedgerFactory | None = None, runner_factory: RunnerFactory = ActionRunner
) -> SafetyReport:
    """Run the change checks, each on a fresh ledger (SQLite in a temporary file by default)."""
    return await run_scenario(ACTION, checks(runner_factory), ledger_factory)
