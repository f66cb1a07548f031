"""Identifiers of one execution only, which must never decide an idempotency key.

A model's tool-call id, an engine's task or checkpoint id, the clock: each
is new when the step runs again (a retry, a resume, the model asking again),
so a key drawn from one, or from a request holding one, would be new too,
and the second run would act again. Every front end refuses such a key
before anything is recorded or invoked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from dataoad._arguments import check_text_arg
from dataoad._errors import InvalidArgumentError

__all__ = [
    "MIN_VOLATILE_LENGTH",
    "call_ids_of",
    "refuse_volatile",
    "refuse_volatile_request",
    "stable_key",
]

#: Shorter identifiers could turn up in a stable key by chance (a step number, say).
MIN_VOLATILE_LENGTH: Final = 8

_ADVICE: Final = (
    "Derive the key from the business intent (an order id, or "
    "dataoad.intent_key(scope, action, request)). Nothing was recorded or invoked"
)


def _present(volatile: Mapping[str, object], text: str) -> tuple[str, str] | None:
    for name, value in volatile.items():
        found = str(value) if value is not None else ""
        if len(found) >= MIN_VOLATILE_LENGTH and found in text:
            return name, found
    return None


def refuse_volatile(key: str, volatile: Mapping[str, object]) -> None:
    """Refuse a key that contains one of the ``volatile`` identifiers (by name)."""
    check_text_arg("idempotency_key", key)  # before looking into it
    found = _present(volatile, key)
    if found is not None:
        raise InvalidArgumentError(
            f"the idempotency key contains the {found[0]} ({found[1]!r}), which changes when "
            "the step runs again (a retry, a resume, the model asking again): the second run "
            f"would get a new key and act twice. {_ADVICE}"
        )


def refuse_volatile_request(request: object, volatile: Mapping[str, object]) -> None:
    """Refuse a request that holds one of the ``volatile`` identifiers: its hash, and a
    key derived from it (the default tool key, ``intent_key``), would be new every run."""
    try:
        # As written, not \u-escaped: an identifier with non-ASCII letters
        # must be found in the text as it is.
        text = json.dumps(request, ensure_ascii=False)
    except (TypeError, ValueError):
        return  # not JSON: execute refuses it by name before anything happens
    found = _present(volatile, text)
    if found is not None:
        raise InvalidArgumentError(
            f"the request contains the {found[0]} ({found[1]!r}), which changes when the step "
            "runs again: its hash, and a key derived from it, would be new on the second run, "
            f"which would act twice. Leave it out of the request. {_ADVICE}"
        )


def call_ids_of(arguments: Mapping[str, Any]) -> dict[str, object]:
    """The model's tool-call ids a framework hands a tool in its context arguments
    (LangGraph's ``ToolRuntime``, the OpenAI Agents SDK's ``ToolContext``, ...)."""
    found: dict[str, object] = {}
    for name, value in arguments.items():
        call_id = getattr(value, "tool_call_id", None)
        if isinstance(call_id, str):
            found[f"model's tool-call id ({name}.tool_call_id)"] = call_id
    return found


def stable_key(derive: Callable[[], str], request: object, volatile: Mapping[str, object]) -> str:
    """``derive()``, refused if a second derivation differs (the clock, a random draw) or
    if it or ``request`` holds a ``volatile`` identifier; before anything happens."""
    key = derive()
    again = derive()
    if again != key:
        raise InvalidArgumentError(
            f"the idempotency key changed between two derivations ({key!r}, {again!r}): "
            f"a key drawn from the clock or at random is new when the step runs again. {_ADVICE}"
        )
    refuse_volatile(key, volatile)
    refuse_volatile_request(request, volatile)
    return key
