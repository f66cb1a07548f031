"""What every framework adapter shares: the extra check and the tool function."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from dataoad._tool import GuardedTool
from dataoad.ledgers.postgres import MissingExtraError

T = TypeVar("T")


def require(module: str, extra: str) -> Any:
    """Import ``module`` or raise MissingExtraError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError.for_extra("this adapter", module, extra) from exc


def tool_function(
    guard: GuardedTool,
    fn: Callable[..., Any],
    *,
    framework: str = "this framework's",
    default_key: Callable[[dict[str, Any]], str] | None = None,
    check_key: Callable[[Callable[[], str], dict[str, Any], object], str] | None = None,
) -> Callable[..., Awaitable[str]]:
    """An async function with ``fn``'s name, docstring and parameters that returns the message.

    Frameworks build the tool's schema from the signature, so it must be
    ``fn``'s own; the return annotation becomes ``str`` (what the model reads).
    Without ``default_key`` the guard must name its own key; ``check_key`` may
    refuse a key (see ``GuardedTool.call``).
    """
    if default_key is None:
        guard.key_function(framework)
    signature = tool_signature(fn)

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        outcome = await guard.call(
            fn, bound.arguments, default_key=default_key, check_key=check_key
        )
        return outcome.message

    return with_signature(tool, fn, signature)


def tool_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature; refused unless every parameter can be passed by keyword."""
    try:
        # Resolved: the tool's wrappers live in another module, where a string
        # annotation of ``fn`` (``from __future__ import annotations``) means nothing.
        signature = inspect.signature(fn, eval_str=True)
    except Exception:  # an annotation that does not resolve: leave them all as written
        signature = inspect.signature(fn)
    if any(
        p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY)
        for p in signature.parameters.values()
    ):
        raise TypeError("a guarded tool takes keyword-compatible parameters only")
    return signature


def with_signature(tool: T, fn: Callable[..., Any], signature: inspect.Signature) -> T:
    """``tool`` showing ``fn``'s parameters and a ``str`` result (what the model reads)."""
    tool.__signature__ = signature.replace(return_annotation=str)  # type: ignore[attr-defined]
    tool.__annotations__ = {
        **{
            name: p.annotation
            for name, p in signature.parameters.items()
            if p.annotation is not p.empty
        },
        "return": str,
    }
    del tool.__wrapped__  # type: ignore[attr-defined]  # frameworks must see this signature
    return tool
