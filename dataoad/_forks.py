"""Which process this is, as far as threads go: a forked child has none of its parent's.

A ledger's connection thread (aiosqlite), a ``SyncActionRunner``'s event
loop thread and the sync bridge's loop all stay behind in the parent when
the process forks (a pre-forking server, ``multiprocessing`` with the
``fork`` start method). Used from the child, a call would wait for a thread
that does not exist: it would hang, silently. A PostgreSQL pool's sockets
are the parent's too, so a child's statement would interleave with the
parent's on one connection. Each of those records the generation it was
made in and refuses a call from another (a typed error, before anything is
read or written); process-wide helpers start afresh in the child.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["FORKED_ADVICE", "generation"]

#: What to do instead, said by every refusal.
FORKED_ADVICE: Final = (
    "a forked child has none of its parent's threads or connections: make a new one in the "
    "child (after the fork); nothing was read or written"
)

_generation = 0


def generation() -> int:
    """How many forks separate this process from the first one that imported Dataoad."""
    return _generation


def _after_fork_in_child() -> None:
    global _generation
    _generation += 1


if hasattr(os, "register_at_fork"):  # not on Windows, which never forks
    os.register_at_fork(after_in_child=_after_fork_in_child)
