"""Idempotency keys from business intent, for front ends whose call ids change.

A model that retries a timed-out tool call issues a new ``tool_call_id`` for
the same intent; an engine that re-executes a step after a crash may see a
new attempt number. A key drawn from either makes the re-execution a second
charge. ``intent_key`` derives the key from what the caller means instead: a
scope (a conversation, an order, a workflow id), the action and the request.

The key is ``"intent-v1:"`` and the lowercase hex SHA-256 of the RFC 8785
form of ``[scope, action_name, request]``: a JSON array, so no choice of
strings can make two different triples share one canonical form, and RFC
8785 fixes every byte (key order, number and string forms) on every host
and Python version. The ``v1`` names this derivation; a change would be a
new prefix, never a new meaning for the old one.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import rfc8785

from dataoad._arguments import MAX_TEXT_ARG_LENGTH, check_text_arg
from dataoad._bounds import DEFAULT_MAX_REQUEST_BYTES
from dataoad._canonical import checked_request_hash
from dataoad._verification import check_stored_text

__all__ = ["INTENT_KEY_PREFIX", "MAX_SCOPE_LENGTH", "intent_key"]

#: What every key ``intent_key`` returns starts with (the derivation's version).
INTENT_KEY_PREFIX: Final = "intent-v1:"
#: Longest scope, in characters (as long as an idempotency key may be).
MAX_SCOPE_LENGTH: Final = MAX_TEXT_ARG_LENGTH["idempotency_key"]


def intent_key(scope: str, action_name: str, request: dict[str, Any]) -> str:
    """A stable idempotency key for ``request`` within ``scope``: same inputs, same key.

    ``scope`` says whose intent it is (a conversation, order or workflow id);
    ``action_name`` is the action the runner executes; ``request`` is a strict
    JSON object of at most the default ``max_request_bytes`` in canonical form
    (as ``execute`` takes it). Raises ``InvalidArgumentError`` or
    ``InvalidRequestError`` for anything else, before anything is written.
    """
    check_stored_text("scope", scope, limit=MAX_SCOPE_LENGTH)
    check_text_arg("action_name", action_name)
    checked_request_hash(request, DEFAULT_MAX_REQUEST_BYTES)
    canonical = rfc8785.dumps([scope, action_name, request])
    return INTENT_KEY_PREFIX + hashlib.sha256(canonical).hexdigest()
