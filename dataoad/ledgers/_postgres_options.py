"""The options of a PostgresLedger, checked before anything connects."""

from __future__ import annotations

import math
from typing import Any

from dataoad._errors import InvalidArgumentError

__all__ = ["check_options", "check_pooled"]


def check_pooled(statement_timeout: Any) -> None:
    """Raise InvalidArgumentError for an option a transaction pooler cannot keep."""
    if statement_timeout is not None:
        raise InvalidArgumentError(
            "statement_timeout is a session setting, which a transaction pooler does not "
            "keep: set it on the role (ALTER ROLE ... SET statement_timeout); "
            "command_timeout still bounds every statement"
        )


def check_options(
    *,
    dsn: Any,
    pool: Any,
    min_size: Any,
    max_size: Any,
    statement_timeout: Any,
    connect_timeout: Any,
    command_timeout: Any,
    serialization_retries: Any,
    transaction_pooling: Any,
) -> None:
    """Raise InvalidArgumentError unless every option is one PostgresLedger can use."""
    if (dsn is None) == (pool is None):
        raise InvalidArgumentError("PostgresLedger needs exactly one of dsn or pool")
    if dsn is not None and (type(dsn) is not str or not dsn):
        raise InvalidArgumentError("dsn must be a non-empty str (postgresql://...)")
    for name, size in (("min_size", min_size), ("max_size", max_size)):
        if type(size) is not int or not 0 <= size <= 1000:
            raise InvalidArgumentError(f"{name} must be an int in [0, 1000]")
    if max_size < 1 or min_size > max_size:
        raise InvalidArgumentError("need 1 <= max_size and min_size <= max_size")
    if statement_timeout is not None and (
        type(statement_timeout) not in (int, float) or not 0.001 <= statement_timeout <= 86_400
    ):
        # The server counts it in whole milliseconds, and 0 there means no limit at all.
        raise InvalidArgumentError(
            "statement_timeout must be seconds in [0.001, 86400] (whole milliseconds to the "
            f"server, where 0 means no limit) or None, not {statement_timeout!r}"
        )
    if type(connect_timeout) not in (int, float) or not 0 < connect_timeout <= 600:
        raise InvalidArgumentError("connect_timeout must be seconds in (0, 600]")
    if command_timeout is not None and (
        type(command_timeout) not in (int, float)
        or not math.isfinite(command_timeout)
        or not 0 < command_timeout <= 3600
    ):
        raise InvalidArgumentError("command_timeout must be seconds in (0, 3600] or None")
    if transaction_pooling is not None and type(transaction_pooling) is not bool:
        raise InvalidArgumentError("transaction_pooling must be a bool or None (find out)")
    if transaction_pooling:
        check_pooled(statement_timeout)
    if type(serialization_retries) is not int or not 0 <= serialization_retries <= 100:
        raise InvalidArgumentError("serialization_retries must be an int in [0, 100]")
