"""The ledger machine (see ledger_machine.py for what it checks)."""

from __future__ import annotations

from stateful_tests.harness import io_bound_settings
from stateful_tests.ledger_machine import LedgerMachine, LedgerMachinePostgres

TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachinePostgres = LedgerMachinePostgres.TestCase
TestLedgerMachinePostgres.settings = io_bound_settings()
