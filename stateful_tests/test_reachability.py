"""Every fault at every gate, every verifier answer and every wait outcome is reached.

A fault the machine never reaches is a fault the suite never tested, however
green it is. This runs the runner machine with the active profile and fails
naming every (gate, decision) pair that no example reached.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from stateful_tests.harness import REACHED, WRITE_FAULTS, LedgerFault, ProviderFault
from stateful_tests.runner_machine import RunnerMachineMemory

WRITES = ("claim", "start_attempt", "record", "release")
READS = ("get", "find")
VERIFIER_ANSWERS = (
    "confirmed",
    "absent",
    "absent retry-safe",
    "unknown",
    "raises",
    "wrong reference",
    "unhealthy",
    "not a result",
)


def required() -> set[tuple[str, str]]:
    pairs = {(f"ledger.{m}", f.name) for m in WRITES for f in WRITE_FAULTS}
    pairs |= {
        (f"ledger.{m}", f.name)
        for m in READS
        for f in (LedgerFault.NONE, LedgerFault.FAIL_BEFORE_WRITE)
    }
    pairs |= {("provider", f.name) for f in ProviderFault}
    # Sync operations run on a worker thread: every provider fault, and a
    # crash while the thread is blocked in the provider call.
    pairs |= {("provider from a worker thread", f.name) for f in ProviderFault}
    pairs |= {("crash", "operation on a worker thread, at provider.charge")}
    pairs |= {("verifier", label) for label in VERIFIER_ANSWERS}
    # A duplicate that waited for the claim holder ended each possible way.
    pairs |= {("wait", "replayed"), ("wait", "ActionInProgressError")}
    # Keys freed by expiry and reopen, refused where the outcome is not
    # definitive, and a second tenant sharing an idempotency key.
    pairs |= {("ledger.retire", f.name) for f in WRITE_FAULTS}
    pairs |= {
        ("lifecycle", "reopened"),
        ("lifecycle", "RecoveryRefusedError"),
        ("lifecycle", "a freed key claimed afresh"),
        ("lifecycle", "expiry asked, UNKNOWN kept its key"),
        ("lifecycle", "pruned"),
        ("namespace", "another tenant's call of a shared key finished"),
    }
    return pairs


#: Rounds of the profile's examples allowed before a pair counts as unreachable.
ROUNDS = 8


def test_every_fault_at_every_gate_and_every_verifier_answer_is_reached() -> None:
    REACHED.clear()
    profile = settings()
    for _ in range(ROUNDS):
        run_state_machine_as_test(
            RunnerMachineMemory,
            settings=settings(profile, max_examples=max(profile.max_examples, 150)),
        )
        missing = sorted(required() - set(REACHED))
        if not missing:
            return
    raise AssertionError(f"never reached in {ROUNDS} rounds: {missing}")
