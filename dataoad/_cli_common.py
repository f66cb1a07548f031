"""What every operator command shares: exit statuses, one-line errors, asking first."""

from __future__ import annotations

import sys

from dataoad._cli_render import printable

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PIPE_CLOSED",
    "EXIT_STILL_UNKNOWN",
    "EXIT_USAGE",
    "CommandError",
    "UsageError",
    "confirm",
]

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
#: ``recover`` ran, but the receipt is still UNKNOWN: read-back proved nothing.
EXIT_STILL_UNKNOWN = 3
#: The reader closed our output (``| head``): stop quietly, as on SIGPIPE.
EXIT_PIPE_CLOSED = 141
#: Ctrl-C: the shell's status for a command ended by SIGINT.
EXIT_INTERRUPTED = 130


class CommandError(Exception):
    """A one-line reason the command failed (exit status 1)."""


class UsageError(Exception):
    """A one-line reason the command was used wrongly (exit status 2)."""


def confirm(question: str, assume_yes: bool) -> None:
    """Ask on the terminal; without one, refuse unless ``--yes`` was given."""
    if assume_yes:
        return
    question = printable(question)  # it names stored keys and actions
    if not sys.stdin or not sys.stdin.isatty():
        raise UsageError(f"{question} Refusing without --yes (no terminal to ask on)")
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise CommandError("cancelled; nothing was changed")
