"""Strict JSON validation of requests and metadata, and the canonical request hash.

Validation is exact on purpose: a ``bool`` is not an ``int``, an ``IntEnum`` is
not an ``int``, a tuple is not a list. Anything Python would silently coerce
could make two different intents share a hash, or one intent hash two ways.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import rfc8785

from dataoad._errors import InvalidArgumentError, InvalidRequestError, ReservedMetadataError
from dataoad._records import PROTOCOL_METADATA_KEYS

__all__ = [
    "MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "RESERVED_METADATA_KEYS",
    "canonical_json",
    "checked_request_hash",
    "json_text",
    "request_hash",
    "validate_json_object",
    "validate_metadata",
    "validate_request",
]

#: Largest integer every JSON consumer can represent exactly (IEEE 754 double).
MAX_SAFE_INTEGER: Final = 2**53 - 1
#: Deeper structures are rejected with a clear error instead of a RecursionError.
MAX_DEPTH: Final = 64

#: Top-level metadata keys owned by the receipt protocol: the ones the
#: runner derives from observations and recoveries (``_records``), and names
#: older receipts used, kept refused so no caller can shadow them.
RESERVED_METADATA_KEYS: Final = PROTOCOL_METADATA_KEYS | {
    "attempt_history",
    "attempt_records",
    "provider",
}


def _describe(value: object) -> str:
    return type(value).__qualname__


class _NotStrictJson(Exception):
    """Raised by the quick walk; the explaining walk then names the path."""


def _scan(value: object) -> bool:
    """Check ``value`` in one walk that builds no paths; raise ``_NotStrictJson`` if invalid.

    The same rules as ``_explain`` (a property test holds the two to the same
    verdict on generated valid and invalid values). Returns whether the
    standard library's C encoder writes the value's RFC 8785 form: it does
    unless a float (ECMAScript number formatting) or a key beyond the Basic
    Multilingual Plane (RFC 8785 sorts keys by UTF-16 code units, Python by
    code points) occurs.
    """
    if type(value) is not dict:
        raise _NotStrictJson
    plain = True
    on_path: set[int] = set()
    stack: list[tuple[object, int, bool]] = [(value, 0, False)]
    try:
        while stack:
            node, depth, leaving = stack.pop()
            if leaving:
                on_path.discard(id(node))
                continue
            node_type = type(node)
            if node_type is str:
                if not node.isascii():  # type: ignore[attr-defined]
                    node.encode("utf-8")  # type: ignore[attr-defined]
                continue
            if node is None or node_type is bool:
                continue
            if node_type is int:
                if not -MAX_SAFE_INTEGER <= node <= MAX_SAFE_INTEGER:  # type: ignore[operator]
                    raise _NotStrictJson
                continue
            if node_type is float:
                if not math.isfinite(node):  # type: ignore[arg-type]
                    raise _NotStrictJson
                plain = False
                continue
            if node_type is not dict and node_type is not list:
                raise _NotStrictJson
            if id(node) in on_path or depth >= MAX_DEPTH:
                raise _NotStrictJson
            on_path.add(id(node))
            stack.append((node, depth, True))
            if node_type is dict:
                for key, child in node.items():  # type: ignore[attr-defined]
                    if type(key) is not str:
                        raise _NotStrictJson
                    if not key.isascii():
                        key.encode("utf-8")
                        if max(key) > "\uffff":
                            plain = False
                    stack.append((child, depth + 1, False))
            else:
                stack.extend((child, depth + 1, False) for child in node)  # type: ignore[attr-defined]
    except UnicodeEncodeError:  # a lone surrogate
        raise _NotStrictJson from None
    return plain


def validate_json_object(
    value: object,
    *,
    root: str,
    error: Callable[[str, str], Exception],
) -> None:
    """Raise ``error(message, path)`` unless ``value`` is a strict JSON object.

    Allowed: exact ``dict`` with exact ``str`` keys; values ``None``, exact
    ``bool``, exact ``int`` within +/-(2**53-1), finite exact ``float``, exact
    ``str`` (valid Unicode), exact ``list`` and nested such dicts.
    """
    _check(value, root=root, error=error)


def _check(value: object, *, root: str, error: Callable[[str, str], Exception]) -> bool:
    # The quick walk decides; only a refusal pays for the walk that names the path.
    try:
        return _scan(value)
    except _NotStrictJson:
        _explain(value, root=root, error=error)
        raise AssertionError("the quick and the explaining JSON walks disagree") from None


def _explain(
    value: object,
    *,
    root: str,
    error: Callable[[str, str], Exception],
) -> None:
    # Valid input never comes here: the quick walk found a fault, and this
    # slower walk finds it again, building the path that names it.
    if type(value) is not dict:
        raise error(f"{root} must be a dict, not {_describe(value)}", root)
    # Iterative walk with an explicit stack: no recursion limit to hit, and the
    # set of containers on the current path detects cycles.
    on_path: set[int] = set()
    stack: list[tuple[object, str, int, bool]] = [(value, root, 0, False)]
    while stack:
        node, path, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(node))
            continue
        node_type = type(node)
        if node is None or node_type is bool or node_type is str:
            if node_type is str:
                _check_text(node, path, error)  # type: ignore[arg-type]
            continue
        if node_type is int:
            if not -MAX_SAFE_INTEGER <= node <= MAX_SAFE_INTEGER:  # type: ignore[operator]
                raise error(
                    f"{path} is an integer outside +/-(2**53-1); pass it as a string",
                    path,
                )
            continue
        if node_type is float:
            if not math.isfinite(node):  # type: ignore[arg-type]
                raise error(f"{path} is a non-finite float ({node!r})", path)
            continue
        if node_type is dict or node_type is list:
            if id(node) in on_path:
                raise error(f"{path} refers back to a containing object (a cycle)", path)
            if depth >= MAX_DEPTH:
                raise error(f"{path} is nested deeper than {MAX_DEPTH} levels", path)
            on_path.add(id(node))
            stack.append((node, path, depth, True))
            if node_type is dict:
                items = list(node.items())  # type: ignore[attr-defined]
                for key, child in reversed(items):
                    if type(key) is not str:
                        raise error(
                            f"{path} has a key of type {_describe(key)} ({key!r}); "
                            "keys must be str",
                            path,
                        )
                    _check_text(key, f"{path} key {key!r}", error)
                    stack.append((child, f"{path}[{_quote(key)}]", depth + 1, False))
            else:
                for index in range(len(node) - 1, -1, -1):  # type: ignore[arg-type]
                    stack.append((node[index], f"{path}[{index}]", depth + 1, False))  # type: ignore[index]
            continue
        raise error(
            f"{path} has unsupported type {_describe(node)}; convert it explicitly "
            "to None, bool, int, float, str, list or dict",
            path,
        )


def _quote(key: str) -> str:
    # Double quotes, as a reader would write the subscript: request["items"].
    return json.dumps(key, ensure_ascii=False)


def _check_text(text: str, path: str, error: Callable[[str, str], Exception]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise error(f"{path} is not valid Unicode (lone surrogate)", path) from None


def _request_error(message: str, path: str) -> Exception:
    return InvalidRequestError(message, path=path)


def _metadata_error(message: str, path: str) -> Exception:
    return InvalidArgumentError(f"metadata is not JSON-compatible: {message}")


def validate_request(request: object) -> None:
    """Raise InvalidRequestError, naming the path, unless ``request`` is strict JSON."""
    validate_json_object(request, root="request", error=_request_error)


def validate_metadata(metadata: object) -> None:
    """Validate caller metadata: strict JSON, and no reserved top-level key."""
    validate_json_object(metadata, root="metadata", error=_metadata_error)
    assert isinstance(metadata, dict)
    reserved = sorted(key for key in metadata if key in RESERVED_METADATA_KEYS)
    if reserved:
        raise ReservedMetadataError(
            f"metadata keys {reserved} are reserved for Dataoad's receipt protocol",
            keys=tuple(reserved),
        )


#: The C encoder, set to write RFC 8785's form of values without floats or
#: keys beyond the BMP (strings escaped as RFC 8785 3.2.2.2 and ECMAScript
#: do: the same seven short escapes, other controls as lowercase \u00xx).
_PLAIN_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False,
    sort_keys=True,
    separators=(",", ":"),
    allow_nan=False,
    check_circular=False,  # the walk already refused cycles
)


def _canonical(value: Mapping[str, Any], plain: bool) -> bytes:
    if plain:
        return _PLAIN_ENCODER.encode(value).encode("utf-8")
    return rfc8785.dumps(value)


def canonical_json(value: Mapping[str, Any]) -> bytes:
    """The RFC 8785 (JSON Canonicalization Scheme) bytes of a strict JSON object."""
    try:
        plain = _scan(value)
    except _NotStrictJson:
        plain = False  # rfc8785 raises its own error
    return _canonical(value, plain)


def request_hash(request: Mapping[str, Any]) -> str:
    """Lowercase hex SHA-256 of the request's RFC 8785 canonical form."""
    return hashlib.sha256(canonical_json(request)).hexdigest()


def checked_request_hash(request: object, max_bytes: int | None = None) -> str:
    """Validate ``request`` like ``validate_request`` and hash it, in one walk on valid input.

    ``max_bytes`` bounds its canonical form (InvalidRequestError beyond it).
    """
    plain = _check(request, root="request", error=_request_error)
    canonical = _canonical(request, plain)  # type: ignore[arg-type]
    if max_bytes is not None and len(canonical) > max_bytes:
        raise _request_error(
            f"request is {len(canonical)} bytes in canonical form, over this runner's "
            f"max_request_bytes={max_bytes}: hash or store large payloads elsewhere and "
            "pass a reference",
            "request",
        )
    return hashlib.sha256(canonical).hexdigest()


# One encoder for every call: ``json.dumps`` with options builds a new one
# each time, which cost as much as encoding a small object. It is reentrant
# (each ``encode`` keeps its own state), so threads may share it.
_JSON_TEXT: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def json_text(value: Any) -> str:
    """Compact JSON text, as ledgers store it; NaN and infinities are refused, as everywhere."""
    return _JSON_TEXT.encode(value)
