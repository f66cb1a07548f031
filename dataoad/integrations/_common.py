"""What every framework adapter shares: the extra check and the tool function."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from dataoad._tool import GuardedTool
from dataoad.ledgers.postgres import MissingExtraError


def require(module: str, extra: str) -> Any:
    """Import ``module`` or raise MissingExtraError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError.for_extra("this adapter", module, extra) from exc


def tool_function(guard: GuardedTool, fn: Callable[..., Any]) -> Callable[..., Awaitable[str]]:
    """An async function with ``fn``'s name, docstring and parameters that returns the message.

    Frameworks build the tool's schema from the signature, so it must be
    ``fn``'s own; the return annotation becomes ``str`` (what the model reads).
    """
    signature = inspect.signature(fn)
    if any(
        p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY)
        for p in signature.parameters.values()
    ):
        raise TypeError("a guarded tool takes keyword-compatible parameters only")

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        outcome = await guard.call(fn, bound.arguments)
        return outcome.message

    tool.__signature__ = signature.replace(return_annotation=str)  # type: ignore[attr-defined]
    tool.__annotations__ = {**getattr(fn, "__annotations__", {}), "return": str}
    del tool.__wrapped__  # frameworks must see this function's signature, not fn's
    return tool
