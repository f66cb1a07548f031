"""Deterministic fakes, fault injection and safety reports for testing adapters."""

from __future__ import annotations

from dataoad.testing._faulty_ledger import FaultyLedger, LedgerFault, LedgerFaultError
from dataoad.testing._payment import (
    Charge,
    ChargeFault,
    FakePaymentProvider,
    LookupFault,
    PaymentLookup,
    PaymentVerifier,
)
from dataoad.testing._report import SafetyCheck, SafetyReport

__all__ = [
    "Charge",
    "ChargeFault",
    "FakePaymentProvider",
    "FaultyLedger",
    "LedgerFault",
    "LedgerFaultError",
    "LookupFault",
    "PaymentLookup",
    "PaymentVerifier",
    "SafetyCheck",
    "SafetyReport",
]
