"""The ledger machine (see ledger_machine.py for what it checks)."""

from __future__ import annotations

from hypothesis import settings

from stateful_tests.harness import io_bound_settings
from stateful_tests.ledger_machine import LedgerMachine, LedgerMachinePostgres
from stateful_tests.reach import reach_checked

# Its search is also its reach check: every rule runs in its own runs (all
# ran in 60 runs of 20 steps when measured; up to three more such rounds).
TestLedgerMachine = reach_checked(
    LedgerMachine,
    settings(),
    pairs=None,
    round_=settings(settings(), max_examples=60, stateful_step_count=20),
    more_rounds=3,
)
TestLedgerMachinePostgres = LedgerMachinePostgres.TestCase
TestLedgerMachinePostgres.settings = io_bound_settings()
