"""Rules that drive the documented bounds to both sides (mixed into the runner machine).

The machine's other rules already meet the wait's deadline (waiters on the
virtual clock) and the busy timeout (a stuck writer lock on SQLite). Two
rules here meet the rest: a request whose canonical form is exactly its
runner's ``max_request_bytes``, or a byte over it; and replays with a
verifier of an UNKNOWN receipt, which pile up observations past the bound
(lowered to ``OBSERVATION_LIMIT``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition

from dataoad import ActionReceipt, ActionStatus
from stateful_tests.harness import Contender
from stateful_tests.reach import rule

__all__ = ["BoundRules", "REQUEST_BOUND_SIDES"]

#: Where a runner's ``max_request_bytes`` stands against its request's canonical size.
REQUEST_BOUND_SIDES: Final = ("exactly", "a byte short")
#: What a duplicate must repeat of the first call, or it is a conflict.
_REQUEST: Final = ("amount", "alternate_reference")


class BoundRules:
    """Callers at a request-size bound (exactly, or a byte over) and verifier replays of UNKNOWN receipts."""

    order_keys: list[str]
    contenders_list: list[Contender]
    max_active: ClassVar[int]
    execute_arguments: ClassVar[dict[str, st.SearchStrategy[Any]]]

    # One rule for both, so that they take one share of the machine's rule
    # choices: as two rules they halved the share of the zombie and
    # lifecycle rules, and bugs only those reach were missed by more seeds.
    @precondition(lambda self: self._active() < self.max_active and bool(self.order_keys))
    @rule(data=st.data())
    def a_bound_is_met(self, data: st.DataObject) -> None:
        """An execute meets its request-size bound exactly or a byte over, or replays an UNKNOWN receipt with a verifier."""
        unknown = self._unknown_keys()
        replay = bool(unknown) and data.draw(st.booleans(), label="replay an UNKNOWN receipt")
        if replay:
            self._replay_with_a_verifier(data, unknown)
        else:
            self._request_at_its_size_bound(data)

    def _request_at_its_size_bound(self, data: st.DataObject) -> None:
        """An execute whose runner's max_request_bytes is its request's canonical size, or a byte less."""
        key = data.draw(st.sampled_from(self.order_keys), label="key")
        side = data.draw(st.sampled_from(REQUEST_BOUND_SIDES), label="max_request_bytes is")
        event(f"request bound: {side}")
        arguments = data.draw(st.fixed_dictionaries(self.execute_arguments), label="execute")
        self.start_execute(key, request_bound=side, **arguments)

    # Verifier observations pile up only on a receipt that stays UNKNOWN and
    # is looked at again: without these replays a run seldom made the three
    # that a bound of two needs before one is dropped.
    def _replay_with_a_verifier(
        self, data: st.DataObject, unknown: list[tuple[str, Contender]]
    ) -> None:
        """A duplicate with a verifier replays a key whose receipt is UNKNOWN (one more observation)."""
        key, first = data.draw(st.sampled_from(unknown), label="UNKNOWN key")
        drawn = {k: v for k, v in self.execute_arguments.items() if k not in _REQUEST}
        drawn["with_verifier"] = st.just(True)
        arguments = data.draw(st.fixed_dictionaries(drawn), label="replay")
        self.start_execute(
            key,
            amount=first.amount,
            alternate_reference=first.reference.endswith("-alt"),
            **arguments,
        )

    def _unknown_keys(self) -> list[tuple[str, Contender]]:
        """(key, the execute that made its receipt) for every key whose receipt is UNKNOWN."""
        found = []
        for key in self.order_keys:
            held = self.holder(key)
            if held is None or held.final_status is not ActionStatus.UNKNOWN:
                continue
            first = next(
                (
                    c
                    for c in self.contenders_list
                    if c.kind == "execute" and c.action_id == held.action_id
                ),
                None,
            )
            if first is not None:
                found.append((key, first))
        return found

    # Provided by the runner machine.
    def _active(self) -> int:
        raise NotImplementedError

    def start_execute(self, key: str, **arguments: Any) -> None:
        raise NotImplementedError

    def holder(self, key: str) -> ActionReceipt | None:
        raise NotImplementedError
