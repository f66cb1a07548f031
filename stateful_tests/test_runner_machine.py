"""The runner machine on every backend (see runner_machine.py for what it checks)."""

from __future__ import annotations

from stateful_tests.harness import (
    in_memory_runner_settings,
    io_bound_settings,
    shared_connection_settings,
)
from stateful_tests.runner_machine import (
    RunnerMachineMemory,
    RunnerMachinePostgres,
    RunnerMachineSQLite,
    RunnerMachineSQLiteShared,
)

TestRunnerMachineMemory = RunnerMachineMemory.TestCase
TestRunnerMachineMemory.settings = in_memory_runner_settings()
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
