"""The runner machine on every backend (see runner_machine.py for what it checks)."""

from __future__ import annotations

from stateful_tests.harness import in_memory_runner_settings, io_bound_settings
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
TestRunnerMachineSQLiteShared = RunnerMachineSQLiteShared.TestCase
TestRunnerMachineSQLiteShared.settings = io_bound_settings()
