"""The verification suite's own speed: stateful steps per second."""

from __future__ import annotations

import logging
import time
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, run_state_machine_as_test


def stateful_steps_per_second(examples: int) -> dict[str, Any]:
    """Run the in-memory runner machine; count steps through an extra invariant."""
    from stateful_tests.test_runner_machine import RunnerMachineMemory

    steps = 0

    class Counted(RunnerMachineMemory):  # type: ignore[misc, valid-type]
        @invariant()
        def count_steps(self) -> None:
            nonlocal steps
            steps += 1

    # Contenders still parked when an example ends are dropped with their loop;
    # asyncio's "Task was destroyed" log lines about them are expected here.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    began = time.perf_counter()
    run_state_machine_as_test(
        Counted,
        settings=settings(
            max_examples=examples,
            stateful_step_count=50,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        ),
    )
    seconds = time.perf_counter() - began
    return {"examples": examples, "steps": steps, "seconds": seconds, "per_second": steps / seconds}
