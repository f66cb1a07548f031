"""Deeply immutable JSON values, so a receipt snapshot cannot be changed in place."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

__all__ = ["FrozenDict", "freeze", "thaw"]


class FrozenDict(dict[str, Any]):
    """A ``dict`` that refuses mutation; JSON encoders treat it as a plain dict."""

    __slots__ = ()

    def _immutable(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("receipt metadata is an immutable snapshot")

    __setitem__ = __delitem__ = _immutable
    clear = pop = popitem = setdefault = update = _immutable
    __ior__ = _immutable

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_frozen, (list(dict.items(self)),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> FrozenDict:
        return self

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


def _rebuild_frozen(items: Iterable[tuple[str, Any]]) -> FrozenDict:
    return FrozenDict(items)


def freeze(value: Any) -> Any:
    """Return a deeply immutable copy: dicts become FrozenDict, lists tuples."""
    if isinstance(value, Mapping):
        if type(value) is FrozenDict:
            return value
        return FrozenDict((key, freeze(item)) for key, item in value.items())
    if isinstance(value, list | tuple):
        return tuple(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """Return a plain mutable copy of a (possibly frozen) JSON value."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(item) for item in value]
    return value
