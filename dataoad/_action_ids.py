"""New action ids: random (version 4) UUIDs from the OS's random source, a page at a time.

Why a page: ``os.urandom`` lets go of the GIL for its system call. On an
event loop whose ledger thread is busy, taking the GIL back costs far more
than the call itself (about 15 µs per id under load, 0.3 µs alone, measured
in ``benchmarks/README.md``). Reading 4 KiB at a time pays that once per
256 ids. The bytes are the same cryptographic bytes, each used once: a page
is handed out in 16-byte slices under a lock, and a forked child drops its
parent's page, which would otherwise give it the parent's next ids.
"""

from __future__ import annotations

import os
import threading
from typing import Final

__all__ = ["new_action_id"]

#: A random (version 4) UUID's bits, set on 128 random bits.
_UUID4_MASK: Final = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_UUID4_BITS: Final = (0x4000 << 64) | (0x8000 << 48)
_PAGE_SIZE: Final = 4096
_ID_SIZE: Final = 16


class _Page:
    """Random bytes read ahead, and how many of them are used."""

    __slots__ = ("bytes", "lock", "used")

    def __init__(self) -> None:
        self.bytes = b""
        self.used = 0
        self.lock = threading.Lock()


_page = _Page()


def new_action_id() -> str:
    """A random UUID4 as 32 hex digits, as ``uuid.uuid4().hex`` writes it."""
    page = _page
    with page.lock:
        if page.used + _ID_SIZE > len(page.bytes):
            page.bytes, page.used = os.urandom(_PAGE_SIZE), 0
        data, start = page.bytes, page.used
        page.used = start + _ID_SIZE
    value = int.from_bytes(data[start : start + _ID_SIZE], "big")
    return f"{value & _UUID4_MASK | _UUID4_BITS:032x}"


def _after_fork_in_child() -> None:
    # A fresh page and a fresh lock: the parent's bytes are its own next ids,
    # and its lock may have been held by a thread that does not exist here.
    global _page
    _page = _Page()


os.register_at_fork(after_in_child=_after_fork_in_child)
