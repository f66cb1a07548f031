"""The verification suite's own speed: stateful steps per second."""

from __future__ import annotations

import logging
import time
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, run_state_machine_as_test


def stateful_steps_per_second(examples: int) -> dict[str, Any]:
    """Run the in-memory runner machine; count steps through an extra invariant."""
    from stateful_tests.runner_machine import RunnerMachineMemory

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


def exhaustive_states_per_second() -> dict[str, Any]:
    """``python -m stateful_tests.exhaustive``'s first default-bound scenario: states and steps per second."""
    from models.bounds import BOUNDS
    from models.explore import explore
    from stateful_tests.exhaustive import RealRunnerRun, quiet_hypothesis

    name, plans, faults, crashes = BOUNDS["default"][0]
    with quiet_hypothesis():
        result = explore(
            name,
            lambda: RealRunnerRun(plans, fault_budget=faults, crashes=crashes),
            depth=40,
        )
    return {
        "scenario": name,
        "states": result.states,
        "seconds": result.seconds,
        "states_per_second": result.states / result.seconds,
        "steps_per_second": result.steps / result.seconds,
    }
