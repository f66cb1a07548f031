"""A claim's key: ``(namespace, action_name, idempotency_key)``, and its limits.

Every backend indexes the key in one unique index. PostgreSQL's B-tree
entries stop at about 2,700 bytes, so besides each part's own limit in
characters, the three together may take at most MAX_KEY_BYTES in UTF-8.
That is what an action name and key of the largest sizes allowed before
namespaces (128 and 512 characters of up to 4 bytes) took, so every key
that was valid then still is in the default namespace.
"""

from __future__ import annotations

from typing import Final

from dataoad._errors import InvalidArgumentError
from dataoad._verification import check_stored_text

__all__ = ["MAX_KEY_BYTES", "MAX_NAMESPACE_LENGTH", "check_key_size", "check_namespace"]

#: Longest namespace, in characters.
MAX_NAMESPACE_LENGTH: Final = 128
#: Longest key, namespace, action name and idempotency key together, in UTF-8 bytes.
MAX_KEY_BYTES: Final = 4 * (128 + 512)


def check_namespace(namespace: object, *, optional: bool = False) -> str | None:
    """A storable namespace: a ``str`` (``""`` is the default one), or None when ``optional``."""
    if namespace is None and optional:
        return None
    if namespace == "" and type(namespace) is str:
        return ""
    check_stored_text("namespace", namespace, limit=MAX_NAMESPACE_LENGTH)
    return namespace  # type: ignore[return-value]


def check_key_size(namespace: str, action_name: str, idempotency_key: str) -> None:
    """Refuse a key every backend could not index (all three parts already checked)."""
    size = sum(len(part.encode("utf-8")) for part in (namespace, action_name, idempotency_key))
    if size > MAX_KEY_BYTES:
        raise InvalidArgumentError(
            f"namespace, action_name and idempotency_key take {size} bytes in UTF-8 together; "
            f"at most {MAX_KEY_BYTES} can be indexed by every ledger"
        )
