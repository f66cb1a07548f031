"""Which faults a user's adapter can stage, and their words in a trace (``dataoad check``)."""

from __future__ import annotations

from dataoad.testing._adapter import ProviderAdapter, ReadFault, SandboxFault

__all__ = ["label", "supported"]


def supported(adapter: ProviderAdapter) -> tuple[list[str], list[str], list[str]]:
    """Which optional fault controls the adapter implements (probed on a fresh sandbox)."""
    sandbox: list[str] = []
    reads: list[str] = []
    skipped: list[str] = []
    for fault in SandboxFault:
        adapter.reset()
        try:
            adapter.stage_sandbox_fault(fault)
        except (NotImplementedError, KeyError):
            # KeyError: an adapter mapping faults through a dict written
            # before this fault existed cannot stage it.
            skipped.append(f"sandbox: {fault.value}")
        else:
            sandbox.append(fault.name)
    adapter.reset()
    try:
        adapter.land_in_flight()
    except NotImplementedError:
        if SandboxFault.IN_FLIGHT.name in sandbox:
            sandbox.remove(SandboxFault.IN_FLIGHT.name)
            skipped.append(f"sandbox: {SandboxFault.IN_FLIGHT.value} (no land_in_flight)")
    for read in ReadFault:
        adapter.reset()
        try:
            adapter.stage_read_fault(read)
        except NotImplementedError:
            skipped.append(f"read: {read.value}")
        else:
            reads.append(read.name)
    adapter.reset()
    return sandbox, reads, skipped


def label(fault: str) -> str:
    """A fault's words: the enum's description for sandbox and read faults."""
    if fault in SandboxFault.__members__:
        return f"sandbox {SandboxFault[fault].value}"
    if fault in ReadFault.__members__:
        return f"sandbox read: {ReadFault[fault].value}"
    return "no fault" if fault == "none" else fault
