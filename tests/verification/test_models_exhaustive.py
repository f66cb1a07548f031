"""``python -m stateful_tests.exhaustive``: the bounded exhaustive check of the real runner.

The default bound must finish clean and report what it covered, and each
planted bug within its reach must be found in the scenario that triggers
it, naming the property it breaks.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from models.bounds import BOUNDS, LEASE_BOUNDS, LIFECYCLE_BOUNDS
from models.explore import explore
from stateful_tests.exhaustive import (
    OUT_OF_REACH,
    RealRunnerRun,
    main,
    quiet_hypothesis,
    scenarios,
)
from stateful_tests.planted_bugs import PLANTED_BUGS, planted

# Slow (bounded exhaustive exploration of the real runner): left out of the quick loop, python -m pytest -m "not slow".
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: The default-bound scenario that triggers each planted bug (its documented trigger).
TRIGGER = {
    "retry-unknown-by-default": "2 contenders, 1 key, retrying policy and no verifier",
    "later-failed-erases-unknown": "1 contender, escape-hatch policy, 2 faults",
    "accept-unbound-confirmation": "1 contender, 2 faults",
    "absence-without-retry-safe-is-failed": "2 contenders, 1 key",
    "release-started-claim": "an execute and an operator's release",
    # Attempt 1 is counted by the claim itself; a start of its own is a retry's.
    "invoke-after-unproven-attempt-start": "1 contender, escape-hatch policy, 2 faults",
    "answers-unknown-to-everything": "2 contenders, 1 key",
    "take-over-after-waiting": "a duplicate that waits for the claim holder",
    "settles-holder-after-waiting": "a duplicate that waits for the claim holder",
    "accept-unproven-completion": "2 contenders, 1 key",
    "never-retries": "2 contenders, 1 key, retrying policy and no verifier",
    "retries-beyond-max-attempts": "1 contender, retrying policy, 3 faults",
    "retries-definitive-declines": "2 contenders, 1 key, retrying policy and no verifier",
    "accepts-degraded-evidence": "2 contenders, 1 key",
    "hash-depends-on-key-order": "3 contenders, 1 key, the same request written three ways",
    "hash-tells-int-from-float": "3 contenders, 1 key, the same request written three ways",
    "invokes-for-in-progress-claim": "2 contenders, 1 key",
    "start-read-back-accepts-any-receipt": "1 contender, escape-hatch policy, 2 faults",
    "retry-start-failure-says-not-invoked": "1 contender, retrying policy, 3 faults",
    "claim-counts-no-attempt": "2 contenders, 1 key",
    "claim-proven-by-key-only": "2 contenders, 1 key",
    # The lifecycle's scenarios (models.bounds.LIFECYCLE_BOUNDS).
    "unknown-receipt-expires": "a reopen racing an expiry",
    "reopens-confirmed": "a reopen racing an expiry",
    "expires-without-being-asked": "an expiry beside a duplicate",
    "expiry-by-the-caller-clock": "an expiry beside a duplicate",
    "expiry-boundary-exclusive": "an expiry beside a duplicate",
}


def _module(*args: str, timeout: float = 170) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_abstract_model_is_clean_on_the_default_bound() -> None:
    done = _module("models")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("abstract protocol:")]
    assert len(lines) == len(BOUNDS["default"]) + len(LEASE_BOUNDS["default"])
    assert sum("lease expiry" in line for line in lines) == len(LEASE_BOUNDS["default"])


@pytest.mark.timeout(900)  # every schedule of the default bound: about 100 s on two cores
def test_default_bound_is_clean_and_reports_its_coverage() -> None:
    done = _module("stateful_tests.exhaustive", timeout=880)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("real runner:")]
    assert len(lines) == len(BOUNDS["default"]) + len(LIFECYCLE_BOUNDS["default"])
    total = re.search(r"total: (\d+) distinct states, (\d+) schedules", done.stdout)
    assert total is not None
    assert int(total.group(1)) > 1000
    assert int(total.group(2)) > 1000


def test_every_planted_bug_is_either_triggered_or_declared_out_of_reach() -> None:
    assert {b.name for b in PLANTED_BUGS} == set(TRIGGER) | set(OUT_OF_REACH)


@pytest.mark.parametrize("name", sorted(TRIGGER))
def test_planted_bug_is_found_exhaustively(name: str) -> None:
    bug = next(b for b in PLANTED_BUGS if b.name == name)
    scenario = next(s for s in scenarios("default") if s[0] == TRIGGER[name])
    _, plans, faults, crashes = scenario
    with planted(bug) as overrides, quiet_hypothesis():
        result = explore(
            name,
            lambda: RealRunnerRun(plans, fault_budget=faults, crashes=crashes, overrides=overrides),
            depth=40,
        )
    assert result.violation is not None, f"{name} not found in {result.states} states"
    assert result.violation.name in bug.expected
    assert result.violation.trace  # a numbered narrative of the run


def test_a_violation_exits_1_with_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    bug = next(b for b in PLANTED_BUGS if b.name == "never-retries")  # patches a global rule
    with planted(bug):
        code = main([])
    out = capsys.readouterr().out
    assert code == 1
    assert "VIOLATION of retryable-failure-is-retried" in out
    assert re.search(r"^\s+1\. contender A: execute order-1", out, re.M)


def test_planted_mode_reports_each_bug() -> None:
    done = _module("stateful_tests.exhaustive", "--planted", "never-retries")
    assert done.returncode == 0, done.stdout  # found, as it must be
    assert "never-retries" in done.stdout
    assert "found as retryable-failure-is-retried" in done.stdout


def _abstract(bound_scenario: str) -> Any:
    from models.abstract import AbstractRun

    _, plans, faults, crashes = next(s for s in BOUNDS["default"] if s[0] == bound_scenario)
    return explore(bound_scenario, lambda: AbstractRun(plans, faults, crashes), depth=40)


def test_the_abstract_protocol_is_clean_at_the_default_bound() -> None:
    for name, *_ in BOUNDS["default"]:
        result = _abstract(name)
        assert result.violation is None, result.violation
        assert result.states > 0


@pytest.mark.parametrize(
    ("broken_rule", "scenario", "expected"),
    [
        (
            "retry without retry-safe evidence",
            "2 contenders, 1 key, retrying policy and no verifier",
            "no-second-mutation-after-unknown",
        ),
        (
            "a degraded verifier's word taken",
            "2 contenders, 1 key",
            "receipts-state-only-permitted-outcomes",
        ),
    ],
)
def test_the_abstract_explorer_finds_a_broken_protocol_rule(
    monkeypatch: pytest.MonkeyPatch, broken_rule: str, scenario: str, expected: str
) -> None:
    import models.abstract as abstract
    from models.protocol import CONFIRMED, FAILED, UNKNOWN

    if broken_rule == "retry without retry-safe evidence":

        def careless(status: str, **kw: Any) -> bool:
            return kw["attempts"] < kw["max_attempts"] and status in (FAILED, UNKNOWN)

        monkeypatch.setattr(abstract, "retry_allowed", careless)
    else:

        def credulous(evidence: Any) -> str:
            if evidence is None or not evidence.bound:
                return UNKNOWN
            return CONFIRMED if evidence.claim == CONFIRMED else FAILED

        monkeypatch.setattr(abstract, "classify_verification", credulous)
    result = _abstract(scenario)
    assert result.violation is not None
    assert result.violation.name == expected
    assert result.violation.trace
