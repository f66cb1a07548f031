"""Deterministic fakes, fault injection and safety reports for testing adapters."""

from __future__ import annotations

from dataoad.testing._faulty_ledger import FaultyLedger, LedgerFault, LedgerFaultError
from dataoad.testing._ledger_contract import DurableLedgerContract, LedgerContract, make_receipt
from dataoad.testing._payment import (
    Charge,
    ChargeFault,
    FakePaymentProvider,
    LookupFault,
    PaymentLookup,
    PaymentVerifier,
)
from dataoad.testing._report import SafetyCheck, SafetyReport
from dataoad.testing._suite import (
    CheckFn,
    LedgerFactory,
    default_ledgers,
    expect,
    in_memory_ledgers,
    run_checks,
    sqlite_ledgers,
)

__all__ = [
    "Charge",
    "DurableLedgerContract",
    "LedgerContract",
    "CheckFn",
    "ChargeFault",
    "FakePaymentProvider",
    "FaultyLedger",
    "LedgerFactory",
    "LedgerFault",
    "LedgerFaultError",
    "LookupFault",
    "PaymentLookup",
    "PaymentVerifier",
    "SafetyCheck",
    "SafetyReport",
    "default_ledgers",
    "expect",
    "make_receipt",
    "in_memory_ledgers",
    "run_checks",
    "sqlite_ledgers",
]
