"""What a mutation run's verdicts mean: which are kills, and a recheck's own verdict.

Only a failed test is a kill. mutmut's other verdicts (a survivor, a CPU
limit, a suspicious run) are rechecked against every example test, and a
recheck that hangs is stopped and is not a kill either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
from pathlib import Path

#: mutmut's verdicts that a failed test stands behind. Every other one
#: ("survived", "no tests", "timeout", "suspicious", "segfault", "not checked")
#: is a survivor until a recheck against every example test fails.
CONFIRMED_KILLS = ("killed", "caught by type check")
#: mutmut's verdict for a mutant it has not run yet (a run stopped early).
NOT_RUN = "not checked"


#: Wall-clock seconds a recheck may take (the example tests take about 4
#: minutes on 2 idle cores). pytest's per-test limit cannot stop a mutant
#: that spins the event loop without yielding (a renewal loop that forgot
#: to sleep held one recheck for over 17 minutes), so the whole run has one.
RECHECK_LIMIT = 20 * 60.0


@dataclasses.dataclass(frozen=True)
class Recheck:
    """What running every example test against one mutant showed."""

    killed: bool
    #: The run passed ``RECHECK_LIMIT`` and was stopped before any test failed.
    hung: bool = False


def run_until(command: list[str], cwd: Path, env: dict[str, str], limit: float) -> Recheck:
    """Run pytest's ``command`` for at most ``limit`` seconds; a failed test in its output is a kill."""
    # Its own session, so the hung xdist workers are stopped with it.
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return Recheck(killed=failed_a_test(output), hung=not failed_a_test(output))
    return Recheck(killed=failed_a_test(output))


def failed_a_test(output: str) -> bool:
    """Whether pytest's ``output`` reports a failed test, or a fixture that broke.

    With -x and two workers pytest reports a stop as "interrupted" (2): a
    failed test, not the exit status, is the kill.
    """
    return re.search(r"^(FAILED|ERROR) ", output, re.M) is not None


def unconfirmed(statuses: dict[str, str]) -> list[str]:
    """The mutants no failed test stands behind (see ``CONFIRMED_KILLS``)."""
    return [name for name, status in statuses.items() if status not in CONFIRMED_KILLS]
