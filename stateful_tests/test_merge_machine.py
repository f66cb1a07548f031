"""The merge machine on every backend (see merge_machine.py for what it checks)."""

from __future__ import annotations

from stateful_tests.harness import io_bound_settings
from stateful_tests.merge_machine import (
    MergeMachineMemory,
    MergeMachinePostgres,
    MergeMachineSQLite,
)

TestMergeMachineMemory = MergeMachineMemory.TestCase
TestMergeMachineSQLite = MergeMachineSQLite.TestCase
TestMergeMachinePostgres = MergeMachinePostgres.TestCase
TestMergeMachineSQLite.settings = io_bound_settings()
TestMergeMachinePostgres.settings = io_bound_settings()
