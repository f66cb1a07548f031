"""Report files the commands write are owner-only, and never written through a link."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from dataoad._owner_only import write_owner_only


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "report.xml"
    old = os.umask(0)  # a umask that would leave a plain open() at 0666
    try:
        write_owner_only(target, "<ok/>\n")
    finally:
        os.umask(old)
    assert _mode(target) == 0o600
    assert target.read_text(encoding="utf-8") == "<ok/>\n"


def test_a_file_that_was_there_is_made_owner_only_and_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("an older, longer report than the new one\n")
    target.chmod(0o644)
    write_owner_only(target, b"{}\n")
    assert _mode(target) == 0o600
    assert target.read_bytes() == b"{}\n"  # nothing of the longer old text is left


def test_text_is_written_as_utf8(tmp_path: Path) -> None:
    target = tmp_path / "page.html"
    write_owner_only(target, "caf\u00e9 \u2192 \U0001f4b3")
    assert target.read_text(encoding="utf-8") == "caf\u00e9 \u2192 \U0001f4b3"


def test_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    elsewhere = tmp_path / "someone-elses.txt"
    elsewhere.write_text("keep me\n")
    elsewhere.chmod(0o644)
    link = tmp_path / "report.xml"
    link.symlink_to(elsewhere)
    with pytest.raises(OSError, match=r"symbolic links|Too many levels") as raised:
        write_owner_only(link, "<overwritten/>")
    assert raised.value.errno == errno.ELOOP  # O_NOFOLLOW: not followed
    assert elsewhere.read_text() == "keep me\n"
    assert _mode(elsewhere) == 0o644


def test_another_users_file_is_refused_and_left_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "theirs.xml"
    target.write_text("theirs\n")
    target.chmod(0o644)
    # This process plays another user: the file is then not its own.
    monkeypatch.setattr(os, "geteuid", lambda: target.stat().st_uid + 1)
    with pytest.raises(OSError, match="another user") as raised:
        write_owner_only(target, "mine")
    assert raised.value.strerror is not None
    assert target.read_text() == "theirs\n"
    assert _mode(target) == 0o644


def test_a_fifo_is_refused_at_once_and_left_as_it_was(tmp_path: Path) -> None:
    fifo = tmp_path / "report.xml"
    os.mkfifo(fifo, 0o644)
    # Nobody reads it: an open for writing that blocked would wait for good.
    with pytest.raises(OSError, match=r"No such device|not a regular file"):
        write_owner_only(fifo, "<x/>")
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:  # read at the other end: opened, then refused, never changed
        with pytest.raises(OSError, match="not a regular file"):
            write_owner_only(fifo, "<x/>")
        assert os.read(reader, 10) == b""  # nothing was written into it
    finally:
        os.close(reader)
    assert _mode(fifo) == 0o644
