"""How long ``dataoad check`` searches: its profiles and Hypothesis settings."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, settings

__all__ = ["PROFILES", "search_settings"]


PROFILES: dict[str, dict[str, Any]] = {
    "ci": {"max_examples": 200, "stateful_step_count": 12},
    "deep": {"max_examples": 3000, "stateful_step_count": 25},
}


def search_settings(profile: str, max_examples: int | None, derandomize: bool) -> settings:
    base = PROFILES[profile]
    return settings(
        max_examples=max_examples or base["max_examples"],
        stateful_step_count=base["stateful_step_count"],
        deadline=None,
        database=None,
        derandomize=derandomize,
        report_multiple_bugs=False,
        print_blob=False,
        # The report is the output: not Hypothesis's own dump of a failing case.
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
        # Not Phase.explain: after shrinking, it reruns the counterexample with
        # each part varied to say which parts matter; on a state machine that
        # took four fifths of a check's time and changes no step of the trace.
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    )
