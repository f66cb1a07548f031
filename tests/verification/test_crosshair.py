"""CrossHair checks the contracts of the pure decision functions symbolically.

The runner calls these functions for every decision that matters (retry,
what a verifier's answer proves, aggregation across attempts, merging of
observations, value correlation). Their docstrings state the specification's
rules as PEP 316 postconditions; CrossHair searches for inputs that break
them. Out of its reach, and covered by property and example tests instead:
request validation and the RFC 8785 hash (C-implemented JSON and SHA-256
make symbolic execution time out) and everything async (CrossHair skips
coroutines).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from suite_support.services import tool

# Slow (CrossHair solves each contract symbolically): left out of the quick loop, python -m pytest -m "not slow".
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: Seconds CrossHair may spend on each postcondition.
PER_CONDITION: float = 4

COVERED = [
    "dataoad._policy.decide_retry",
    "dataoad._verification.classify_fields",
    "dataoad._evidence.attempt_evidence",
    "dataoad._evidence.aggregate_attempts",
    "dataoad._evidence.merge_observations",
    "dataoad._evidence.combine",
    "dataoad._evidence.recovered_value_correlated",
]


def crosshair(
    *targets: str, cwd: Path = ROOT, per_condition: float = PER_CONDITION
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *tool("crosshair"),
            "check",
            "--analysis_kind=PEP316",
            f"--per_condition_timeout={per_condition}",
            *targets,
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=600,
    )


@pytest.mark.parametrize("target", COVERED)
def test_contract_has_no_counterexample(target: str) -> None:
    done = crosshair(target)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("module", "function", "rule", "broken_rule"),
    [
        (
            "_policy",
            "decide_retry",
            "    if status is ActionStatus.UNKNOWN:\n        return retry_on_unknown",
            "    if status is ActionStatus.UNKNOWN:\n        return not retry_on_unknown",
        ),
        (
            "_verification",
            "classify_fields",
            "and conclusive_absence is True and retry_safe is True:",
            "and conclusive_absence is True:",
        ),
    ],
)
def test_crosshair_finds_a_planted_contract_violation(
    tmp_path: Path, module: str, function: str, rule: str, broken_rule: str
) -> None:
    planted = tmp_path / f"planted{module}.py"
    source = (ROOT / "dataoad" / f"{module}.py").read_text()
    broken = source.replace(rule, broken_rule)
    assert broken != source, "the planted edit no longer applies"
    planted.write_text(broken)
    # Finding stops at the first counterexample, so a generous time limit
    # costs nothing when the check works and keeps a loaded machine from
    # passing the planted bug off as clean.
    done = crosshair(f"{planted.stem}.{function}", cwd=tmp_path, per_condition=12)
    assert done.returncode == 1, done.stdout + done.stderr
    assert function in done.stdout
