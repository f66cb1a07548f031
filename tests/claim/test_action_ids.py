"""New action ids: random version 4 UUIDs, each drawn once, in threads and across a fork.

They are read from the OS's random source a page at a time
(``dataoad/_action_ids.py``); these tests hold the page to the properties
an id needs: the UUID4 shape, no repeat within a process or between its
threads, and none between a process and a child forked from it.
"""

from __future__ import annotations

import os
import threading
import uuid
import warnings

import pytest

import dataoad._action_ids as action_ids
from dataoad._action_ids import _PAGE_SIZE, new_action_id

#: The bits a UUID4 takes from its random bytes, and the version and variant it sets.
RANDOM_BITS = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
UUID4_BITS = (0x4000 << 64) | (0x8000 << 48)


def test_an_id_is_a_version_4_uuid_in_32_hex_digits() -> None:
    for _ in range(3 * _PAGE_SIZE // 16):  # across page boundaries
        action_id = new_action_id()
        parsed = uuid.UUID(hex=action_id)
        assert parsed.hex == action_id
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_ids_do_not_repeat_within_a_process_or_between_its_threads() -> None:
    drawn: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def draw(into: list[str]) -> None:
        start.wait()
        into.extend(new_action_id() for _ in range(2_000))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [action_id for into in drawn for action_id in into]
    assert len(every) == 16_000
    assert len(set(every)) == len(every)


def test_ids_vary_in_every_random_bit() -> None:
    """Not a page's bytes read again: each of the 122 random bits takes both values."""
    seen_one, seen_zero = 0, 0
    for _ in range(512):
        value = int(new_action_id(), 16)
        seen_one |= value
        seen_zero |= ~value
    assert seen_one & RANDOM_BITS == RANDOM_BITS
    assert seen_zero & RANDOM_BITS == RANDOM_BITS


def test_each_id_is_the_next_sixteen_bytes_of_a_page_read_when_the_last_is_used_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every byte read is used once, and an id is never made of fewer than sixteen."""
    reads: list[int] = []

    def page(number: int, size: int) -> bytes:
        return bytes((number * 7 + n) % 256 for n in range(size))  # each page its own

    def urandom(size: int) -> bytes:
        reads.append(size)
        return page(len(reads), size)

    monkeypatch.setattr(action_ids, "_page", action_ids._Page())
    # The os module _action_ids reads from (it imports os itself, not urandom).
    monkeypatch.setattr(os, "urandom", urandom)
    per_page = _PAGE_SIZE // 16
    drawn = [new_action_id() for _ in range(2 * per_page + 1)]
    assert reads == [_PAGE_SIZE] * 3
    expected = [
        f"{int.from_bytes(page(k, _PAGE_SIZE)[n : n + 16], 'big') & RANDOM_BITS | UUID4_BITS:032x}"
        for k in (1, 2, 3)
        for n in range(0, _PAGE_SIZE, 16)
    ][: len(drawn)]
    assert drawn == expected


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork exists on POSIX only")
def test_a_forked_child_never_draws_its_parents_next_ids() -> None:
    new_action_id()  # the parent has a page, most of it unused
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a threaded process may deadlock the
        # child: this child takes no lock the fork could have left held (the
        # page's lock is new in it, which is what this test checks).
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent, then out without cleanup
        try:
            os.write(write_end, "".join(new_action_id() for _ in range(8)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    children = {child[n : n + 32] for n in range(0, len(child), 32)}
    parents = {new_action_id() for _ in range(8)}
    assert len(children) == 8
    assert not children & parents
