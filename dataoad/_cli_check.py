"""``dataoad check TARGET``: search a user's provider adapter for contract violations.

TARGET is a Python file defining one ProviderAdapter subclass (or an
``adapter`` attribute), or ``module:attribute`` naming a subclass, an
instance, or a zero-argument factory. Exit status: 0 no violation found
within the budget, 1 a violation (with its shrunk trace), 2 a usage error,
3 the adapter's sandbox hooks (reset, effects, in_flight, staging a fault)
raised, so the search could not go on.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_check_command", "run_check_command"]

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE, EXIT_ADAPTER_ERROR = 0, 1, 2, 3
#: Bounds of ``--call-timeout`` (seconds).
CALL_TIMEOUT_RANGE = (0.001, 3600.0)


class CheckUsageError(Exception):
    """A one-line reason the check cannot run (exit status 2)."""


def add_check_command(commands: Any) -> None:
    """Register ``check`` on the top-level subcommand parser."""
    check = commands.add_parser(
        "check",
        help="search your provider adapter for contract violations, with shrunk traces",
        description=(
            "Run the adapter-contract state machine over TARGET with a bounded budget. "
            "TARGET is a .py file defining one ProviderAdapter subclass, or module:attribute."
        ),
    )
    check.add_argument("target", metavar="TARGET", help="path/to/adapter.py or module:attribute")
    check.add_argument("--profile", choices=("ci", "deep"), default="ci", help="search budget")
    check.add_argument("--max-examples", type=int, metavar="N", help="override the budget")
    check.add_argument("--seed", type=int, metavar="N", help="seed the search (reproducible)")
    check.add_argument(
        "--call-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a perform or verify call taking longer is a violation (default 10; 0.001 to 3600)",
    )
    check.add_argument("--trace-json", metavar="FILE", help="also write the report as JSON")
    check.add_argument("--junit-xml", metavar="FILE", help="also write a JUnit XML report")
    check.add_argument(
        "--html", metavar="FILE", help="also draw the counterexample as an HTML sequence diagram"
    )


def _module_from_file(path: Path) -> Any:
    from dataoad._cli_loading import UsageProblem, load_module

    try:
        return load_module(path)
    except UsageProblem as problem:
        raise CheckUsageError(str(problem)) from None


def _adapter_from(obj: Any, where: str) -> Any:
    from dataoad.testing._adapter import ProviderAdapter

    if isinstance(obj, ProviderAdapter):
        return obj
    if inspect.isclass(obj) and issubclass(obj, ProviderAdapter):
        return obj()
    if callable(obj):
        try:
            made = obj()
        except (Exception, SystemExit) as exc:
            raise CheckUsageError(f"{where}() raised {type(exc).__name__}: {exc}") from None
        if isinstance(made, ProviderAdapter):
            return made
        raise CheckUsageError(
            f"{where}() returned {type(made).__qualname__}, not a ProviderAdapter"
        )
    raise CheckUsageError(f"{where} is not a ProviderAdapter subclass, instance or factory")


def load_adapter(target: str) -> tuple[Any, str]:
    """The adapter instance TARGET names, and a display name."""
    from dataoad.testing._adapter import ProviderAdapter

    file_part, _, attribute = target.rpartition(":")
    if file_part.endswith(".py") and attribute:
        # The form a report prints: path/to/adapter.py:Name.
        module = _module_from_file(Path(file_part))
        if not hasattr(module, attribute):
            raise CheckUsageError(f"{file_part} defines no {attribute!r}")
        return _adapter_from(getattr(module, attribute), target), target
    if target.endswith(".py") or os.sep in target:
        path = Path(target)
        module = _module_from_file(path)
        if hasattr(module, "adapter"):
            return _adapter_from(module.adapter, f"{target}:adapter"), f"{target}:adapter"
        own = [
            value
            for value in vars(module).values()
            if inspect.isclass(value)
            and issubclass(value, ProviderAdapter)
            and value is not ProviderAdapter
            and value.__module__ == module.__name__
        ]
        if len(own) != 1:
            names = ", ".join(sorted(c.__name__ for c in own)) or "none"
            raise CheckUsageError(
                f"{target}: define exactly one ProviderAdapter subclass or an `adapter` "
                f"attribute (found: {names}); or name one as module:attribute"
            )
        return own[0](), f"{target}:{own[0].__name__}"
    from dataoad._cli_loading import import_attribute

    try:
        obj = import_attribute(target)
    except ValueError:
        raise CheckUsageError(
            f"TARGET must be a .py file or module:attribute, not {target!r}"
        ) from None
    except LookupError as problem:
        raise CheckUsageError(str(problem)) from None
    return _adapter_from(obj, target), target


def run_check_command(args: argparse.Namespace) -> int:
    """Run ``dataoad check``; prints the report and returns the exit status."""
    try:
        from dataoad.testing import _adapter_check
        from dataoad.testing._adapter_watch import CallWatch, OverdueCall
    except ImportError as exc:
        print(f"dataoad check: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.max_examples is not None and not 1 <= args.max_examples <= 1_000_000:
        print("dataoad check: error: --max-examples must be in [1, 1000000]", file=sys.stderr)
        return EXIT_USAGE
    low, high = CALL_TIMEOUT_RANGE
    if not low <= args.call_timeout <= high:  # NaN fails too
        print(
            f"dataoad check: error: --call-timeout must be in [{low:g}, {high:g}] seconds",
            file=sys.stderr,
        )
        return EXIT_USAGE
    for option, path in (
        ("--html", args.html),
        ("--trace-json", args.trace_json),
        ("--junit-xml", args.junit_xml),
    ):
        problem = None if path is None else _unwritable(path)
        if problem is not None:
            # Before the search: a search of minutes must not end in a traceback.
            print(f"dataoad check: error: {option} {path}: {problem}", file=sys.stderr)
            return EXIT_USAGE
    try:
        adapter, name = load_adapter(args.target)
    except CheckUsageError as problem:
        print(f"dataoad check: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except (Exception, SystemExit) as exc:
        print(f"dataoad check: error: {args.target}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # Progress only for a person watching a terminal; logs and pipes stay clean.
    live = sys.stderr.isatty()

    def progress(line: str) -> None:
        sys.stderr.write(f"\r\033[K{line}")
        sys.stderr.flush()

    started = time.monotonic()

    def overdue(late: OverdueCall) -> None:
        # On the watch's thread, while the loop's thread is still inside the call.
        detail = (
            f"{late.call} for {late.reference} had not returned after {late.seconds:.1f} s "
            f"(--call-timeout {args.call_timeout:g}): it blocked the check's event loop or "
            "ignored the timer's cancellation, so the check ended there, in the example "
            "that was running"
        )
        broken = "calls-return-within-the-call-timeout"
        # The call is still running, so no step has recorded it yet: the last step says it.
        steps = [
            *late.steps,
            {
                "number": len(late.steps) + 1,
                "actor": "checker",
                "text": f"invariant {broken} broken: {detail}",
            },
        ]
        report = _adapter_check.AdapterCheckReport(
            adapter=name,
            examples=late.examples,
            seconds=time.monotonic() - started,
            violation=_adapter_check.AdapterViolation(broken, detail, steps, shrunk=False),
            skipped_faults=[],
        )
        status = EXIT_VIOLATION
        try:
            if live:
                sys.stderr.write("\r\033[K")
            status = _report(report, args)
        finally:
            # Whatever writing the report raised: the loop's thread cannot be
            # stopped nor joined, so the process ends here, or it would hang.
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)

    # Twice the call timeout and a second: the loop's own timer ends what it can first.
    watch = CallWatch(2 * args.call_timeout + 1.0, overdue)
    try:
        with watch:
            report = _adapter_check.check_adapter(
                adapter,
                profile=args.profile,
                max_examples=args.max_examples,
                seed_value=args.seed,
                name=name,
                call_timeout=args.call_timeout,
                progress=progress if live else None,
                watch=watch,
            )
    finally:
        if live:
            sys.stderr.write("\r\033[K")
    return _report(report, args)


def _report(report: Any, args: argparse.Namespace) -> int:
    """Write the report files, print the report; the exit status it stands for."""
    from dataoad.testing import _adapter_check

    if report.error is not None:
        status = EXIT_ADAPTER_ERROR
    else:
        status = EXIT_OK if report.passed else EXIT_VIOLATION
    # The files first: a reader that stops early (| head) must not cost them.
    for option, path, write in (
        ("--html", args.html, _adapter_check.write_html),
        ("--trace-json", args.trace_json, _adapter_check.write_json),
        ("--junit-xml", args.junit_xml, _adapter_check.write_junit),
    ):
        if path is None:
            continue
        try:
            write(report, path)
        except OSError as problem:  # checked before the search, changed since
            print(f"dataoad check: error: {option} {path}: {problem.strerror}", file=sys.stderr)
            status = EXIT_USAGE
    try:
        print(report.render(), flush=True)
    except BrokenPipeError:
        # The reader went away: say nothing more, and keep the exit status.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status


def _unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written as a report file, or None if it can."""
    target = Path(path)
    if target.is_dir():
        return "is a folder"
    folder = target.parent
    if not folder.is_dir():
        return f"folder {folder} does not exist"
    if target.is_symlink():
        return "is a symbolic link"  # never written through: the file is made owner-only
    if target.exists() and not target.is_file():
        return "is not a regular file"  # a device or a FIFO: never made owner-only
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return "not writable"
    if target.exists() and target.stat().st_uid != os.geteuid():
        return "belongs to another user; name a new file"
    return None
