"""What keeps the console safe to run: bind rules, the token, sessions, CSRF, headers.

Loopback only unless told ``allow_remote`` with a token; any action needs the
token (a session made by logging in with it) and the session's CSRF token;
the token is compared in constant time; the session cookie is ``HttpOnly``
and ``SameSite=Strict``; every response forbids inline scripts and every
asset from elsewhere, framing and sniffing.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import threading
from collections import OrderedDict
from typing import Final

__all__ = [
    "COOKIE",
    "HEADERS",
    "Sessions",
    "check_bind",
    "is_loopback",
    "same_secret",
]

#: The session cookie's name.
COOKIE: Final = "dataoad_console"
#: Sent with every response: no script runs, nothing loads from elsewhere.
HEADERS: Final = {
    "content-security-policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
#: Sessions kept at once (the oldest is forgotten first).
MAX_SESSIONS: Final = 1000


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` reaches this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def check_bind(host: str, *, allow_remote: bool, token: str | None, allow_actions: bool) -> None:
    """ValueError with the reason when these settings would expose the ledger."""
    if not is_loopback(host):
        if not allow_remote:
            raise ValueError(
                f"--host {host} is not a loopback address: the console would be reachable "
                "from other machines; pass --allow-remote (with DATAOAD_CONSOLE_TOKEN set)"
            )
        if token is None:
            raise ValueError("--allow-remote needs a token: set DATAOAD_CONSOLE_TOKEN")
    if allow_actions and token is None:
        raise ValueError("--allow-actions needs a token: set DATAOAD_CONSOLE_TOKEN")
    if token is not None and len(token) < 16:
        raise ValueError("DATAOAD_CONSOLE_TOKEN must be at least 16 characters")


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison of two secrets."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class Sessions:
    """Logged-in sessions: a random id in the cookie, its CSRF token kept here."""

    def __init__(self) -> None:
        self._csrf: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def start(self) -> tuple[str, str]:
        """A new session: (its id, its CSRF token)."""
        session, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self._lock:
            self._csrf[session] = csrf
            while len(self._csrf) > MAX_SESSIONS:
                self._csrf.popitem(last=False)
        return session, csrf

    def csrf(self, session: str | None) -> str | None:
        """The CSRF token of a live session, or None."""
        if not session:
            return None
        with self._lock:
            for known, csrf in self._csrf.items():
                if same_secret(session, known):
                    return csrf
        return None

    def end(self, session: str | None) -> None:
        """Forget a session (logging out)."""
        with self._lock:
            for known in list(self._csrf):
                if session and same_secret(session, known):
                    del self._csrf[known]
