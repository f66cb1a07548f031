"""The client-side bounds of one runner: request and metadata size, verifier time.

Every bound is checked before any ledger write or provider call, and each
has a safe default and an explicit escape hatch (a larger number, or None
for the verifier's time). A receipt is rewritten on every transition, so
unbounded caller metadata would be rewritten (and stored) at every step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final

from dataoad._errors import InvalidArgumentError

__all__ = [
    "DEFAULT_MAX_METADATA_BYTES",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_VERIFIER_TIMEOUT",
    "MAX_BYTES",
    "MAX_VERIFIER_TIMEOUT",
    "Bounds",
    "check_bounds",
]

#: Largest canonical request (RFC 8785 bytes) ``execute`` accepts by default: 1 MiB.
DEFAULT_MAX_REQUEST_BYTES: Final = 1 << 20
#: Largest caller metadata (compact JSON, UTF-8) by default: 64 KiB.
DEFAULT_MAX_METADATA_BYTES: Final = 64 << 10
#: How long a verifier may take by default before its answer counts as UNKNOWN.
DEFAULT_VERIFIER_TIMEOUT: Final = 30.0
#: The largest size bound one may set: 64 MiB.
MAX_BYTES: Final = 64 << 20
#: The longest verifier time limit one may set: an hour.
MAX_VERIFIER_TIMEOUT: Final = 3600.0


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """A runner's bounds, checked."""

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES
    #: Seconds; None: a verifier may take as long as it takes.
    verifier_timeout: float | None = DEFAULT_VERIFIER_TIMEOUT


def _size(name: str, value: object) -> int:
    if type(value) is not int or not 1 <= value <= MAX_BYTES:
        raise InvalidArgumentError(
            f"{name} must be an int of bytes in [1, {MAX_BYTES}], not {value!r}"
        )
    return value


def check_bounds(
    max_request_bytes: object, max_metadata_bytes: object, verifier_timeout: object
) -> Bounds:
    """The bounds, or InvalidArgumentError naming the one that is wrong."""
    if verifier_timeout is not None and (
        type(verifier_timeout) not in (int, float)
        or not math.isfinite(verifier_timeout)  # type: ignore[arg-type]
        or not 0 < verifier_timeout <= MAX_VERIFIER_TIMEOUT  # type: ignore[operator]
    ):
        raise InvalidArgumentError(
            f"verifier_timeout must be None or seconds in (0, {MAX_VERIFIER_TIMEOUT:g}], "
            f"not {verifier_timeout!r}"
        )
    return Bounds(
        _size("max_request_bytes", max_request_bytes),
        _size("max_metadata_bytes", max_metadata_bytes),
        None if verifier_timeout is None else float(verifier_timeout),  # type: ignore[arg-type]
    )
