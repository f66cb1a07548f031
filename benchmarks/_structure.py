"""Which library modules one first call passes through, in order (#40).

Not a time: a count, the same on every machine. A profile hook follows the
Python frame stack through one ``execute`` of a no-op in memory and notes
each time the innermost ``dataoad`` frame changes module, on a call and on
a return alike. A stop is one such change; a module is re-entered when
the call comes back to it after leaving it. #40 asks for at most 8 distinct
modules, none re-entered more than 3 times.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from types import FrameType
from typing import Any

from dataoad import ActionRunner, InMemoryLedger

__all__ = ["first_call_path", "structure_figures"]

REQUEST = {"amount": 100, "currency": "usd", "customer": "c1"}


async def _noop() -> None:
    return None


def _library_module(frame: FrameType | None) -> str | None:
    # The innermost frame of the library, skipping asyncio's and the caller's.
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == "dataoad" or name.startswith("dataoad."):
            return str(name)
        frame = frame.f_back
    return None


async def first_call_path() -> list[str]:
    """The library modules one warm first call in memory passes through, in order."""
    runner = ActionRunner(InMemoryLedger())
    await runner.execute("charge", _noop, request=REQUEST, idempotency_key="warm")
    path: list[str] = []

    def note(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = _library_module(frame)
        elif event == "return":
            module = _library_module(frame.f_back)
        else:
            return  # calls into C change no Python module
        if module is not None and (not path or path[-1] != module):
            path.append(module)

    sys.setprofile(note)
    try:
        await runner.execute("charge", _noop, request=REQUEST, idempotency_key="traced")
    finally:
        sys.setprofile(None)
    return path


async def structure_figures() -> dict[str, float]:
    """The #40 structure figures of one first call, named with their goals."""
    path = await first_call_path()
    entries = Counter(path)
    return {
        "first call: library modules entered, #40 (goal <= 8)": len(entries),
        "first call: most re-entries of one module, #40 (goal <= 3)": max(entries.values()) - 1,
        "first call: module changes along the way": len(path),
    }


if __name__ == "__main__":
    for step in asyncio.run(first_call_path()):
        print(step)
