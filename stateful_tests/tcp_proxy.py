"""A TCP proxy on 127.0.0.1 that can go silent: connections stay open, nothing flows.

What a network partition looks like to a client (no reset, no FIN): used to
show that every PostgreSQL statement, and its cancellation, is bounded.
Bytes sent during the partition are held, as TCP's retransmissions would
deliver them once it heals. Runs on the test's own event loop; ``silent``
is switched by the test (``partition()`` and ``heal()``).
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

__all__ = ["SilentProxy"]


class SilentProxy:
    """Forwards 127.0.0.1:port to a target until ``silent`` is set; then drops every byte."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._open = asyncio.Event()
        self._open.set()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._after_login = False

    @classmethod
    def for_dsn(cls, dsn: str) -> SilentProxy:
        """A proxy in front of the server a ``postgresql://`` DSN names."""
        parts = urlsplit(dsn)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    def dsn(self, dsn: str) -> str:
        """``dsn`` pointed at this proxy instead."""
        parts = urlsplit(dsn)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    @property
    def silent(self) -> bool:
        """Whether the partition is on."""
        return not self._open.is_set()

    def partition(self) -> None:
        """Nothing flows from now on, in either direction; no connection is closed."""
        self._open.clear()

    def partition_after_login(self) -> None:
        """Each connection made from now on goes silent for good once the server has
        logged it in (its first ReadyForQuery): the partition falls between a pool's
        connect and the first statement it sends on the new connection."""
        self._after_login = True

    def heal(self) -> None:
        """Bytes flow again, those held during the partition first."""
        self._open.set()

    async def start(self) -> None:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close every connection and stop listening."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._open.wait()  # a connection opened in a partition waits for it to heal
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        cut = asyncio.Event() if self._after_login else None
        for source, sink, login in ((reader, up_writer, None), (up_reader, writer, cut)):
            task = asyncio.ensure_future(self._pump(source, sink, cut, login))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        cut: asyncio.Event | None = None,
        login: asyncio.Event | None = None,
    ) -> None:
        seen = _LoginWatch() if login is not None else None
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await source.read(65536):
                await self._open.wait()  # the partition: held, never dropped, never closed
                if cut is not None and cut.is_set():
                    continue  # partitioned after its login: nothing flows any more
                sink.write(data)
                await sink.drain()
                if seen is not None and login is not None and seen.ready_in(data):
                    login.set()
            await self._open.wait()
            sink.close()  # the other side's FIN, passed on


class _LoginWatch:
    """Reads the server's side of a PostgreSQL connection until its first ReadyForQuery."""

    def __init__(self) -> None:
        self._buffer = b""
        self._first = True

    def ready_in(self, data: bytes) -> bool:
        """Whether ``data`` (the next bytes) completes the login."""
        self._buffer += data
        if self._first and self._buffer[:1] in (b"N", b"S"):
            self._buffer = self._buffer[1:]  # the answer to an SSLRequest: one byte
        self._first = False
        while len(self._buffer) >= 5:
            length = int.from_bytes(self._buffer[1:5], "big")
            if len(self._buffer) < 1 + length:
                return False
            kind, self._buffer = self._buffer[:1], self._buffer[1 + length :]
            if kind == b"Z":
                return True
        return False
