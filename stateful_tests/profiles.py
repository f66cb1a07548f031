"""Hypothesis profiles (ci, deep, dev), registered and loaded on import.

Loaded explicitly: Hypothesis would otherwise pick its own settings when it
sees CI=true, and a run must mean the same thing on a laptop and in CI.
``HYPOTHESIS_PROFILE`` chooses one; ``ci`` is the default.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

__all__ = ["PHASES"]

#: Every phase but Phase.explain, which reruns a shrunk counterexample with
#: each part varied to say which parts matter: on these state machines it
#: cost more than the search and the shrink together and changes no step.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)

# The example database lives outside the repository tree's tracked files
# (.hypothesis/ is git-ignored); the ci profile does not use one at all, so a
# CI run never depends on what an earlier run found.
# 200 examples per machine; the in-memory runner machine, which hunts most
# of the planted bugs, takes three times that, the budget at which each of
# its bugs is found by 10 of 10 fresh seeds (stateful_tests/LOG.md).
# Machines on a file or a server take a quarter of it
# (stateful_tests.harness: in_memory_runner_settings, io_bound_settings).
settings.register_profile(
    "ci",
    phases=PHASES,
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    derandomize=False,
    database=None,
    print_blob=True,
    # Stateful machines drive real ledgers (SQLite on disk); a slow data
    # generation is the machine's I/O, not a strategy problem.
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "deep",
    phases=PHASES,
    max_examples=2000,
    stateful_step_count=80,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    phases=PHASES,
    max_examples=30,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

_profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if _profile not in {"ci", "deep", "dev"}:
    raise RuntimeError(f"HYPOTHESIS_PROFILE must be ci, deep or dev, not {_profile!r}")
settings.load_profile(_profile)
