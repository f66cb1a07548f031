"""Report files the commands write, readable by their owner alone.

A report of ``dataoad check`` or ``dataoad test`` holds action names, keys,
provider references and whatever an adapter answered (bounded and made
printable, but the adapter's own words). Like the ledger file and the prune
export, it is created ``0600``; a file that was there already is made
owner-only as it is rewritten, and one that belongs to another user is
refused rather than rewritten through (a link someone else placed is
refused too).
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["write_owner_only"]


def write_owner_only(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path``, replacing it, with mode ``0600``.

    Raises OSError (its ``strerror`` says why) when the file cannot be
    written, is a symbolic link, is not a regular file (a device, a FIFO),
    or belongs to another user; nothing is written or changed then.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    # Non-blocking: a FIFO nobody reads would hold the open for good (it is
    # refused below anyway); a regular file never blocks.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            # Never chmod'ed nor truncated: as root, /dev/null made 0600 breaks it for all.
            raise OSError(errno.EINVAL, "is not a regular file; name a file", str(path))
        if found.st_uid != os.geteuid():
            raise OSError(errno.EPERM, "belongs to another user; name a new file", str(path))
        os.fchmod(fd, 0o600)
        # Truncated only once it is known to be ours and owner-only.
        os.ftruncate(fd, 0)
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
