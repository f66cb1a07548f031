"""The grouped writer's machine (see group_machine.py for what it checks)."""

from __future__ import annotations

from hypothesis import settings

from stateful_tests.group_machine import GroupMachineBase

TestGroupMachine = GroupMachineBase.TestCase
TestGroupMachine.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
