"""Safety checks and the qualified safety report."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Final

from dataoad._errors import InvalidArgumentError

__all__ = ["SAFE", "UNSAFE", "SafetyCheck", "SafetyReport"]

SAFE: Final = "SAFE UNDER TESTED CONDITIONS"
UNSAFE: Final = "UNSAFE UNDER TESTED CONDITIONS"


@dataclasses.dataclass(frozen=True, slots=True)
class SafetyCheck:
    """One named check of a safety suite. ``passed`` must be exactly True or False."""

    name: str
    passed: bool
    detail: str = ""

    def __post_init__(self) -> None:
        if type(self.name) is not str or not self.name:
            raise InvalidArgumentError("SafetyCheck.name must be a non-empty str")
        if type(self.passed) is not bool:
            raise InvalidArgumentError(
                f"SafetyCheck.passed must be exactly True or False, not "
                f"{type(self.passed).__qualname__} {self.passed!r}"
            )
        if type(self.detail) is not str:
            raise InvalidArgumentError("SafetyCheck.detail must be a str")


class SafetyReport:
    """The outcome of a deterministic safety suite for one action.

    "Safe under tested conditions" is a statement about these scenarios
    only, never a proof. Only exact SafetyCheck instances are accepted, so no
    look-alike or subclass can render a pass it did not earn.
    """

    __slots__ = ("_checks", "action_name", "comparison")

    def __init__(
        self,
        action_name: str,
        checks: Sequence[SafetyCheck],
        comparison: str | None = None,
    ) -> None:
        if type(action_name) is not str or not action_name:
            raise InvalidArgumentError("action_name must be a non-empty str")
        if isinstance(checks, str | bytes) or not isinstance(checks, Sequence):
            raise InvalidArgumentError("checks must be a sequence of SafetyCheck")
        checks = tuple(checks)
        if not checks:
            raise InvalidArgumentError("a safety report needs at least one check")
        for index, check in enumerate(checks):
            if type(check) is not SafetyCheck:
                raise InvalidArgumentError(
                    f"checks[{index}] is a {type(check).__qualname__}, not a SafetyCheck"
                )
            # Re-check: a frozen dataclass can still be forced with object.__setattr__.
            if type(check.passed) is not bool:
                raise InvalidArgumentError(f"checks[{index}].passed is not a bool")
        if comparison is not None and type(comparison) is not str:
            raise InvalidArgumentError("comparison must be a str or None")
        self.action_name = action_name
        self._checks = checks
        self.comparison = comparison

    @property
    def checks(self) -> tuple[SafetyCheck, ...]:
        """The checks, in the order they ran."""
        return self._checks

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(check.passed is True for check in self._checks)

    @property
    def classification(self) -> str:
        """``SAFE UNDER TESTED CONDITIONS`` or ``UNSAFE UNDER TESTED CONDITIONS``."""
        return SAFE if self.passed else UNSAFE

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description of the report."""
        return {
            "action_name": self.action_name,
            "passed": self.passed,
            "classification": self.classification,
            "comparison": self.comparison,
            "checks": [
                {"name": c.name, "passed": c.passed, "detail": c.detail} for c in self._checks
            ],
        }

    def render(self) -> str:
        """The human-readable text report."""
        lines: list[str] = []
        if self.comparison:
            lines.extend([self.comparison.rstrip("\n"), ""])
        lines.append(f"Action: {self.action_name}")
        lines.append("")
        width = max(len(c.name) for c in self._checks) + 2
        for check in self._checks:
            verdict = "PASS" if check.passed else "FAIL"
            line = f"{check.name:<{width}}{verdict}"
            if not check.passed and check.detail:
                line += f"  ({check.detail})"
            lines.append(line)
        lines.extend(["", "Final classification:", self.classification])
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"SafetyReport(action_name={self.action_name!r}, checks={len(self._checks)}, "
            f"classification={self.classification!r})"
        )
