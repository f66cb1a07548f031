"""Every planted example bug still finds the code it changes, in the quick loop.

``stateful_tests/test_planted_examples.py`` plants each bug and runs its tests (slow); a
refactoring that moves the code makes it fail only there. This reads the files alone, so
the quick loop says at once which example to rewrite.
"""

from __future__ import annotations

import pytest

from stateful_tests.planted_examples import PLANTED_EXAMPLES, ROOT, PlantedExample


@pytest.mark.parametrize("bug", PLANTED_EXAMPLES, ids=lambda b: b.name)
def test_the_code_a_planted_example_changes_is_there_exactly_once(bug: PlantedExample) -> None:
    source = (ROOT / bug.path).read_text(encoding="utf-8")
    assert source.count(bug.old) == 1, (
        f"planted example {bug.name}: {bug.old!r} occurs {source.count(bug.old)} times in "
        f"{bug.path}; rewrite the example"
    )
    assert bug.new != bug.old
