"""What ``dataoad check`` reports: the invariants in words, the violation, the files.

Kept apart from the state machine so the report can be read, rendered and
written without Hypothesis.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from dataoad._cli_render import printable
from dataoad._owner_only import write_owner_only
from dataoad._receipt import ActionReceipt
from dataoad._result import ActionResult
from dataoad._status import ActionStatus

__all__ = [
    "FIXES",
    "INVARIANTS",
    "AdapterCheckReport",
    "AdapterViolation",
    "describe_answer",
    "describe_outcome",
    "describe_receipt",
    "shown",
    "write_html",
    "write_json",
    "write_junit",
]

#: What each invariant means, in words; the trace names the one that broke.
INVARIANTS: dict[str, str] = {
    "confirmed-only-with-the-effect": "a receipt or a bound, healthy verifier answer says "
    "CONFIRMED only when the provider holds the effect",
    "failed-only-when-nothing-can-appear": "a receipt says FAILED only when the provider holds "
    "no effect and no request for it is still in flight",
    "at-most-one-effect-per-claim": "one claim never leads to two effects at the provider",
    "retry-safe-absence-only-when-final": "the verifier says 'absent, retry-safe' only when the "
    "provider holds no effect and nothing for the reference is in flight",
    "verifier-names-the-receipts-reference": "without a staged read fault, a healthy verifier "
    "answer names the receipt's own provider reference",
    "definitive-failure-only-when-nothing-committed": "perform raises DefinitiveFailure only "
    "when the call left no effect and nothing in flight",
    "calls-return-within-the-call-timeout": "every perform and verify call returns or raises "
    "within the check's call timeout",
}


#: What to change in the adapter when each invariant breaks.
FIXES: dict[str, str] = {
    "confirmed-only-with-the-effect": "answer confirmed only after reading the provider's own "
    "record of the effect for this reference; never report a success nobody saw",
    "failed-only-when-nothing-can-appear": "answer absent (retry-safe) only from a read proving "
    "nothing is stored and nothing is in flight for the reference; raise DefinitiveFailure only "
    "when the provider refused the request",
    "at-most-one-effect-per-claim": "send the receipt's provider reference (and the attempt's "
    "fencing token) with every request so the provider deduplicates; never retry inside perform",
    "retry-safe-absence-only-when-final": "on a read error, a stale or partial read, or a request "
    "that may still be in flight, answer unknown (or unhealthy), never absent with retry_safe=True",
    "verifier-names-the-receipts-reference": "look the effect up by receipt.provider_reference "
    "and return that same reference as verified_provider_reference",
    "definitive-failure-only-when-nothing-committed": "raise DefinitiveFailure only for an answer "
    "proving the provider did not act (a validation refusal); let timeouts, resets and server "
    "errors propagate as they are",
    "calls-return-within-the-call-timeout": "give every request and every read a client-side "
    "timeout, so a provider that never answers ends in an error, not a hang",
}

#: Characters XML 1.0 cannot carry at all, escaped or not.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def shown(text: object, limit: int = 120) -> str:
    """An adapter's string for the trace: cut to ``limit`` characters, nothing a terminal acts on."""
    return printable(str(text)[:limit])


def describe_answer(answer: object) -> str:
    """A verifier's answer in words, as the checker saw it (for the trace)."""
    from dataoad._status import VerificationHealth
    from dataoad._verification import VerificationResult

    if isinstance(answer, BaseException):
        return f"raised {type(answer).__name__}: {shown(answer)}"
    if not isinstance(answer, VerificationResult):
        return f"returned {type(answer).__name__}, not a VerificationResult"
    absent = answer.outcome is ActionStatus.FAILED and answer.conclusive_absence
    words = ["absent" if absent else answer.outcome.value.lower()]
    if answer.retry_safe:
        words.append("retry-safe")
    if answer.health is not VerificationHealth.HEALTHY:
        words.append(answer.health.value.lower())
    if answer.verified_provider_reference is not None:
        words.append(f"for {shown(answer.verified_provider_reference)}")
    else:
        words.append("naming no reference")
    if answer.reason:
        words.append(f"({shown(answer.reason, 80)})")
    return "answered " + " ".join(words)


def describe_receipt(receipt: ActionReceipt | None) -> str:
    """A receipt in a few words (claim state, outcome, attempts), for the trace."""
    if receipt is None:
        return "no claim"
    final = "-" if receipt.final_status is None else receipt.final_status.value
    return (
        f"{receipt.claim_state.value}/{final}, {receipt.attempts} attempt"
        f"{'s' if receipt.attempts != 1 else ''}"
    )


def describe_outcome(outcome: object) -> str:
    """What a call returned or raised, in a few words, for the trace."""
    if isinstance(outcome, ActionResult):
        return (
            f"{outcome.status.value}"
            f"{' (replayed)' if outcome.replayed else ''}, execution="
            f"{'-' if outcome.receipt.execution_status is None else outcome.receipt.execution_status.value}"
        )
    if isinstance(outcome, BaseException):
        return f"raised {type(outcome).__name__}: {shown(outcome)}"
    return shown(repr(outcome))


class AdapterViolation(AssertionError):
    """The adapter (with Dataoad) broke a named invariant; carries the trace."""

    def __init__(
        self,
        invariant_name: str,
        detail: str,
        steps: list[dict[str, Any]],
        *,
        shrunk: bool = True,
    ) -> None:
        super().__init__(f"{invariant_name}: {detail}")
        self.invariant = invariant_name
        self.detail = detail
        self.steps = steps
        #: False when the check ended at the violation (a call no timer could end).
        self.shrunk = shrunk


@dataclasses.dataclass
class AdapterCheckReport:
    """What a check found: a violation with its trace, or none within the budget."""

    adapter: str
    examples: int
    seconds: float
    violation: AdapterViolation | None
    skipped_faults: list[str]
    #: Why the search stopped early: an adapter's sandbox hook raised (None: it ran).
    error: str | None = None

    @property
    def passed(self) -> bool:
        """True when the search ran and found no violation (which is not a proof of correctness)."""
        return self.violation is None and self.error is None

    def render(self) -> str:
        """The human-readable report."""
        lines = [f"dataoad check {self.adapter}"]
        for fault in self.skipped_faults:
            lines.append(f"  skipped fault: {fault} (the adapter cannot stage it)")
        if self.error is not None:
            lines.append(
                f"the check could not finish: {self.error} (after {self.examples} examples, "
                f"{self.seconds:.1f} s). The adapter's sandbox hooks (reset, effects, in_flight, "
                "staging a fault) must work for the search to judge anything"
            )
            return "\n".join(lines)
        if self.violation is None:
            lines.append(
                f"none found in {self.examples} examples ({self.seconds:.1f} s): no violation "
                "within this budget, which is a search result, not a proof"
            )
            return "\n".join(lines)
        v = self.violation
        lines.append(f"VIOLATION of {v.invariant}: {INVARIANTS.get(v.invariant, '')}")
        lines.append(f"  {v.detail}")
        if v.invariant in FIXES:
            lines.append(f"What to fix: {FIXES[v.invariant]}")
        kind = "Shrunk trace" if v.shrunk else "Trace, not shrunk"
        lines.append(f"{kind} ({len(v.steps)} steps, found in {self.seconds:.1f} s):")
        for step in v.steps:
            lines.append(f"  {step['number']:>2}. {step['actor']}: {step['text']}")
            if step.get("verifier"):
                lines.append(f"      verifier: {step['verifier']}")
            if step.get("provider"):
                lines.append(f"      provider: {step['provider']}")
            if step.get("ledger"):
                lines.append(f"      ledger:   {step['ledger']}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The same report as JSON-ready data."""
        return {
            "adapter": self.adapter,
            "examples": self.examples,
            "seconds": round(self.seconds, 3),
            "skipped_faults": self.skipped_faults,
            "error": self.error,
            "violation": None
            if self.violation is None
            else {
                "invariant": self.violation.invariant,
                "meaning": INVARIANTS.get(self.violation.invariant, ""),
                "fix": FIXES.get(self.violation.invariant, ""),
                "detail": self.violation.detail,
                "shrunk": self.violation.shrunk,
                "steps": self.violation.steps,
            },
        }


def write_junit(report: AdapterCheckReport, path: str) -> None:
    """A one-test JUnit XML file for CI systems."""
    from xml.sax.saxutils import escape, quoteattr

    def text(value: str) -> str:
        return escape(_NOT_XML.sub("\ufffd", value))

    failure = ""
    failures = errors = 0
    if report.error is not None:
        errors = 1
        message = quoteattr(_NOT_XML.sub("\ufffd", report.error))
        failure = f"<error message={message}>{text(report.render())}</error>"
    elif report.violation is not None:
        failures = 1
        failure = (
            f"<failure message={quoteattr(report.violation.invariant)}>"
            f"{text(report.render())}</failure>"
        )
    xml = (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        f'<testsuite name="dataoad check" tests="1" failures="{failures}" errors="{errors}" '
        f'time="{report.seconds:.3f}">'
        f'<testcase classname="dataoad.check" name={quoteattr(_NOT_XML.sub("?", report.adapter))} '
        f'time="{report.seconds:.3f}">{failure}</testcase></testsuite>\n'
    )
    write_owner_only(path, xml)


def write_json(report: AdapterCheckReport, path: str) -> None:
    """The report as a JSON file."""
    write_owner_only(path, json.dumps(report.to_json(), indent=2) + "\n")


def write_html(report: AdapterCheckReport, path: str) -> None:
    """The counterexample as a self-contained HTML sequence diagram (or a page saying none)."""
    from dataoad.testing._trace_html import render_html, steps_from_adapter

    violation = report.violation
    broken = None
    steps: list[Any] = []
    if report.error is not None:
        summary = f"The check could not finish: {report.error}."
    elif violation is None:
        summary = (
            f"No violation found in {report.examples} examples ({report.seconds:.1f} s): "
            "a search result within this budget, not a proof."
        )
    else:
        broken = f"{violation.invariant}: {INVARIANTS.get(violation.invariant, '')}"
        if violation.invariant in FIXES:
            broken += f". What to fix: {FIXES[violation.invariant]}"
        steps = steps_from_adapter(violation.steps)
        summary = (
            f"A violation, found in {report.seconds:.1f} s; the "
            f"{'shrunk trace' if violation.shrunk else 'trace (not shrunk)'} has "
            f"{len(steps)} steps. {violation.detail[:1].upper()}{violation.detail[1:]}"
        )
    page = render_html(f"dataoad check {report.adapter}", steps, broken, summary)
    write_owner_only(path, page)
