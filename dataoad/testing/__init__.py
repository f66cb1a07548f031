"""Deterministic fakes, fault injection, safety reports and the adapter checker.

The adapter checker (``check_adapter``, ``adapter_test_case``) needs
Hypothesis: install the ``testing`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataoad.testing._adapter import ProviderAdapter, ReadFault, SandboxFault
from dataoad.testing._argument_contract import ArgumentContract
from dataoad.testing._faulty_ledger import FaultyLedger, LedgerFault, LedgerFaultError
from dataoad.testing._lease_contract import LeaseContract, ManualClock
from dataoad.testing._ledger_contract import DurableLedgerContract, LedgerContract, make_receipt
from dataoad.testing._legacy import unstarted_claim
from dataoad.testing._lifecycle_contract import LifecycleContract
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

if TYPE_CHECKING:  # what a type checker sees; at run time they load on first use (below)
    from dataoad.testing._adapter_check import (
        AdapterCheckReport,
        AdapterViolation,
        adapter_test_case,
        check_adapter,
    )

__all__ = [
    "unstarted_claim",
    "AdapterCheckReport",
    "ArgumentContract",
    "AdapterViolation",
    "ProviderAdapter",
    "ReadFault",
    "SandboxFault",
    "adapter_test_case",
    "check_adapter",
    "Charge",
    "DurableLedgerContract",
    "LedgerContract",
    "LeaseContract",
    "LifecycleContract",
    "ManualClock",
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


def __getattr__(name: str) -> object:
    # The checker imports Hypothesis; load it only when asked for.
    if name in {"AdapterCheckReport", "AdapterViolation", "adapter_test_case", "check_adapter"}:
        from dataoad.testing import _adapter_check

        return getattr(_adapter_check, name)
    raise AttributeError(f"module 'dataoad.testing' has no attribute {name!r}")
