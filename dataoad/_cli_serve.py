"""``dataoad serve``: the operator console a team shares (the ``console`` extra).

Every refusal to start is one line and exit status 2: a non-loopback host
without ``--allow-remote`` and a token, actions without a token, a verifier
that cannot be loaded. The token comes from ``DATAOAD_CONSOLE_TOKEN`` only,
never from the command line (which other users of the machine can read).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from dataoad._cli_common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, CommandError, UsageError
from dataoad._cli_recover import load_verifier
from dataoad._errors import MissingExtraError

__all__ = ["add_serve_command", "console_settings", "run_serve_command"]

TOKEN_VARIABLE = "DATAOAD_CONSOLE_TOKEN"


def add_serve_command(commands: Any, url_option: Any) -> None:
    """Register ``dataoad serve``."""
    serve = commands.add_parser(
        "serve",
        help="serve the operator console: the queue, receipts, the audit (the console extra)",
        epilog=f"read-only unless --allow-actions and ${TOKEN_VARIABLE} are given; "
        "loopback only unless --allow-remote and the token are given",
    )
    url_option(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    serve.add_argument(
        "--verifiers",
        metavar="MODULE:ATTR",
        help="a verifier, or a mapping of action name to verifier, for 'verify now'",
    )
    serve.add_argument(
        "--allow-actions",
        action="store_true",
        help=f"let logged-in users verify, reopen and release (needs ${TOKEN_VARIABLE})",
    )
    serve.add_argument(
        "--allow-remote",
        action="store_true",
        help=f"bind a non-loopback host (needs ${TOKEN_VARIABLE}; put TLS in front)",
    )


def console_settings(args: argparse.Namespace, token: str | None) -> Any:
    """The console's settings for ``args``, or UsageError/CommandError."""
    from dataoad._cli_open import open_ledger_pair
    from dataoad._console.app import ConsoleSettings
    from dataoad._console.security import check_bind, is_loopback

    try:
        check_bind(
            args.host,
            allow_remote=args.allow_remote,
            token=token,
            allow_actions=args.allow_actions,
        )
    except ValueError as problem:
        raise UsageError(str(problem)) from None
    if not 0 < args.port < 65_536:
        raise UsageError("--port must be between 1 and 65535")
    verifiers = None
    if args.verifiers is not None:
        try:
            verifiers = load_verifier(args.verifiers, "--verifiers")
        except CommandError as problem:  # a refusal to start, like every other
            raise UsageError(str(problem)) from None
    open_reader, open_writer, postgres = open_ledger_pair(args.ledger, args.table)
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1", "[::1]", args.host)
    if not is_loopback(args.host):
        hosts = ("*",)  # reached by whatever name the team uses; the token guards it
    return ConsoleSettings(
        open_reader=open_reader,
        open_writer=open_writer,
        reader_per_request=not postgres,
        token=token,
        allow_actions=args.allow_actions,
        verifiers=verifiers,
        allowed_hosts=hosts,
    )


def run_serve_command(args: argparse.Namespace) -> int:
    """Start the console; one line and exit status 2 when it must not start."""
    token = os.environ.get(TOKEN_VARIABLE) or None
    try:
        try:
            import uvicorn

            from dataoad._console.app import build_app
        except ImportError as problem:
            raise CommandError(
                str(MissingExtraError.for_extra("dataoad serve", str(problem.name), "console"))
            ) from None
        settings = console_settings(args, token)
    except UsageError as problem:
        print(f"dataoad serve: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except CommandError as problem:
        print(f"dataoad serve: error: {problem}", file=sys.stderr)
        return EXIT_ERROR
    mode = "actions allowed" if args.allow_actions else "read-only"
    print(f"dataoad console ({mode}) on http://{args.host}:{args.port}/", file=sys.stderr)
    # Named, not "auto": the same modules on every machine, no websockets.
    uvicorn.run(
        build_app(settings),
        host=args.host,
        port=args.port,
        log_level="warning",
        loop="asyncio",
        http="h11",
        ws="none",
        lifespan="on",
    )
    return EXIT_OK
