"""Every test here is slow (state machines, planted bugs, reachability).

They are marked so here, in one place, and left out of the quick loop
(``python -m pytest -m "not slow"``); ``.ci/run`` runs them all.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "stateful_tests" in item.path.parts:
            item.add_marker(pytest.mark.slow)
