"""The runner machine on every backend (see runner_machine.py for what it checks)."""

from __future__ import annotations

from hypothesis import settings

from stateful_tests.harness import (
    in_memory_runner_settings,
    io_bound_settings,
    shared_connection_settings,
)
from stateful_tests.reach import reach_checked, runner_pairs
from stateful_tests.runner_machine import (
    RunnerMachineMemory,
    RunnerMachinePostgres,
    RunnerMachineSQLite,
    RunnerMachineSQLiteShared,
)

# In memory, the search is also the reach check: every rule runs and every
# fault at every gate, every verifier answer and every wait outcome is
# reached by its own runs (rules and pairs still missing get up to ten more
# rounds of 100 runs of 50 steps, the budget the separate checks had: most
# often one rare fault, the retirement's, is missing, and one round reaches it).
_PROFILE = settings()
TestRunnerMachineMemory = reach_checked(
    RunnerMachineMemory,
    in_memory_runner_settings(),
    pairs=runner_pairs,
    round_=settings(
        _PROFILE,
        max_examples=max(_PROFILE.max_examples // 2, 100),
        stateful_step_count=max(_PROFILE.stateful_step_count, 50),
    ),
    more_rounds=10,
)
TestRunnerMachineSQLite = RunnerMachineSQLite.TestCase
TestRunnerMachinePostgres = RunnerMachinePostgres.TestCase
TestRunnerMachineSQLite.settings = io_bound_settings()
TestRunnerMachinePostgres.settings = io_bound_settings()

# SQLite contenders sharing one connection, their writes committed in groups.
# The whole budget, not an I/O-bound quarter: it is the one machine that
# fails a group's COMMIT under the real runner, and at a quarter its planted
# bug (runner-trusts-a-rolled-back-group) was found by 6 seeds of 10 (LOG.md).
TestRunnerMachineSQLiteShared = RunnerMachineSQLiteShared.TestCase
TestRunnerMachineSQLiteShared.settings = shared_connection_settings()
