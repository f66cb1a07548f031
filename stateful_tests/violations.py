"""Named property violations: one exception class per property.

Its own module, so that the harness (which formats traces) and the
properties (which read the harness's records) need not import each other.
"""

from __future__ import annotations

__all__ = ["InvariantViolation", "violation_type"]


class InvariantViolation(AssertionError):
    """A named property of the protocol does not hold."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"invariant {name} broken: {detail}")
        self.name = name
        self.detail = detail


_KINDS: dict[str, type[InvariantViolation]] = {}


def violation_type(name: str) -> type[InvariantViolation]:
    """One exception class per property, so Hypothesis keeps them apart.

    Hypothesis tells failures apart by exception type and raise site; all
    properties are raised from one place, so without their own types a
    shrink could wander from one broken property to another.
    """
    if name not in _KINDS:
        _KINDS[name] = type(
            "InvariantViolation_" + name.replace("-", "_"), (InvariantViolation,), {}
        )
    return _KINDS[name]
