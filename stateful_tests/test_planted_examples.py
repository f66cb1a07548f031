"""Every planted example bug makes the example tests named for it fail (and only it is changed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stateful_tests.planted_examples import PLANTED_EXAMPLES, PlantedExample, copy_checkout
from suite_support.services import postgres_dsn

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("bug", PLANTED_EXAMPLES, ids=lambda b: b.name)
def test_planted_example_bug_is_caught_by_its_tests(bug: PlantedExample, tmp_path: Path) -> None:
    env = {**os.environ}
    if bug.needs_postgres:
        env["DATAOAD_TEST_POSTGRES_DSN"] = postgres_dsn()
    copy = bug.plant(tmp_path)
    # The copy comes first on the path, child processes included, so the
    # planted code is what every test (and every process it starts) imports.
    env["PYTHONPATH"] = str(copy)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *bug.tests],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 1, (
        f"{bug.name} ({bug.rule}) was not caught:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    )
    # Failed, not errored: a test that cannot even run proves nothing.
    assert re.search(r"^FAILED \S+", done.stdout, re.M), done.stdout[-3000:]
    assert not re.search(r"^ERROR (tests|stateful_tests)/", done.stdout, re.M), done.stdout[-3000:]


def test_the_copy_without_a_bug_passes_the_same_tests(tmp_path: Path) -> None:
    """The named tests pass on an unplanted copy: only the bug makes them fail."""
    tests = [t for bug in PLANTED_EXAMPLES if not bug.needs_postgres for t in bug.tests]
    copy = copy_checkout(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests],
        cwd=copy,
        env={**os.environ, "PYTHONPATH": str(copy)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
