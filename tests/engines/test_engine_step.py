"""What every engine guard shares, without an engine: the default wait for a dead worker's claim."""

from __future__ import annotations

import pytest

from dataoad import ActionRunner, InMemoryLedger
from dataoad.integrations._engine import LEASE_WAIT, EngineStep


def _default_wait(lease: float | None) -> float | None:
    runner = ActionRunner(InMemoryLedger(), lease=lease)
    step = EngineStep(
        "DBOS",
        runner,
        "charge",
        request={},
        provider_reference=None,
        verifier=None,
        policy=None,
        wait_in_progress=LEASE_WAIT,
    )
    return step.wait_in_progress


@pytest.mark.parametrize(
    ("lease", "wait"),
    [
        (30.0, 65.0),  # the default lease: twice it, plus 5 s (docs/how-to/engines/dbos.md)
        (0.5, 6.0),
        (1797.5, 3600.0),  # exactly the longest wait
        (1800.0, 3600.0),  # past it: capped, not refused
        (None, None),  # no lease: a dead worker's claim never runs out, so no waiting
    ],
)
def test_a_re_executed_step_waits_twice_the_lease_plus_five_seconds(
    lease: float | None, wait: float | None
) -> None:
    assert _default_wait(lease) == wait
