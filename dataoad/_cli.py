"""The ``dataoad`` command line.

``dataoad test PATH`` loads a Python file (or every scenario file in a
folder), calls its zero-argument ``run_safety_suite()`` and reports.
Exit status: 0 every check passed, 1 a check failed, 2 usage or load error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataoad._cli_check import add_check_command, run_check_command
from dataoad._cli_ledger import add_commands, run_ledger_command
from dataoad._cli_loading import UsageProblem, importable_from, load_module
from dataoad._cli_serve import run_serve_command
from dataoad._owner_only import write_owner_only
from dataoad._version import __version__

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own usage errors: exit 2, one line
        self.print_usage(sys.stderr)
        raise SystemExit(f"{self.prog}: error: {message}") from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every ``dataoad`` subcommand."""
    parser = _Parser(
        prog="dataoad",
        description="Evidence-based execution contracts for side-effecting actions.",
    )
    parser.add_argument("--version", action="version", version=f"dataoad {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    test = commands.add_parser(
        "test",
        help="run a safety suite file (or every one in a folder) and report",
        description=(
            "Load PATH, call its zero-argument run_safety_suite() (sync or async) and print "
            "the safety report. With a folder, run every scenario file in it."
        ),
    )
    test.add_argument(
        "path", metavar="PATH", help="a .py file with run_safety_suite(), or a folder"
    )
    test.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    test.add_argument("--junit-xml", metavar="FILE", help="also write a JUnit XML report to FILE")
    test.add_argument("--debug", action="store_true", help="show tracebacks for load errors")
    add_check_command(commands)
    add_commands(commands, _Parser)
    return parser


def load_suite(path: Path) -> Any:
    """Import the file at ``path`` and return its ``run_safety_suite`` callable."""
    module = load_module(path)
    suite = getattr(module, "run_safety_suite", None)
    if suite is None:
        raise UsageProblem(f"{path}: defines no run_safety_suite()")
    if not callable(suite):
        raise UsageProblem(f"{path}: run_safety_suite is not callable")
    return suite


def run_file(path: Path) -> Any:
    """Load and run one suite file; returns its SafetyReport."""
    from dataoad.testing._report import SafetyReport
    from dataoad.testing._suite import run_suite

    suite = load_suite(path)
    try:
        with importable_from(path.parent.resolve()):
            report = run_suite(suite)
    except TypeError as exc:
        if "not a SafetyReport" in str(exc):
            raise UsageProblem(f"{path}: {exc}") from exc
        raise UsageProblem(
            f"{path}: run_safety_suite() raised {type(exc).__name__}: {exc}"
        ) from exc
    except (Exception, SystemExit) as exc:
        # SystemExit too: an exit inside the suite would end this command
        # with the suite's own status (0: a silent pass, with no report).
        raise UsageProblem(
            f"{path}: run_safety_suite() raised {type(exc).__name__}: {exc}"
        ) from exc
    assert type(report) is SafetyReport
    return report


def scenario_files(folder: Path) -> list[Path]:
    """The scenario files of a folder: ``*.py`` not starting with ``_``, sorted."""
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def _junit(results: Sequence[tuple[Path, Any]]) -> bytes:
    suites = ET.Element("testsuites", name="dataoad test")
    for path, report in results:
        failures = sum(1 for c in report.checks if not c.passed)
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=f"{report.action_name} ({path})",
            tests=str(len(report.checks)),
            failures=str(failures),
            errors="0",
        )
        for check in report.checks:
            case = ET.SubElement(
                suite, "testcase", classname=report.action_name, name=check.name, file=str(path)
            )
            if not check.passed:
                failure = ET.SubElement(case, "failure", message=check.detail or "check failed")
                failure.text = check.detail
            elif check.detail:
                ET.SubElement(case, "system-out").text = check.detail
    data: bytes = ET.tostring(suites, encoding="utf-8", xml_declaration=True)
    return data


def command_test(args: argparse.Namespace) -> int:
    """``dataoad test``: run suites, print reports, write JUnit XML if asked."""
    from dataoad.testing._report import SAFE, UNSAFE

    target = Path(args.path)
    if target.is_dir():
        files = scenario_files(target)
        if not files:
            raise UsageProblem(f"{target}: folder holds no scenario files (*.py)")
        results: list[tuple[Path, Any]] = []
        for path in files:
            suite = load_suite(path)  # fail fast, before running anything
            del suite
        for path in files:
            results.append((path, run_file(path)))
        folder = True
    elif target.exists():
        results = [(target, run_file(target))]
        folder = False
    else:
        raise UsageProblem(f"{target}: no such file or folder")

    passed = all(report.passed for _, report in results)
    if args.format == "json":
        if folder:
            payload: dict[str, Any] = {
                "path": str(target),
                "passed": passed,
                "classification": SAFE if passed else UNSAFE,
                "reports": [{"path": str(p), **r.to_dict()} for p, r in results],
            }
        else:
            path, report = results[0]
            payload = {"path": str(path), **report.to_dict()}
        print(json.dumps(payload, indent=2))
    else:
        blocks = [report.render() for _, report in results]
        if folder:
            blocks = [
                f"== {path}\n{block}" for (path, _), block in zip(results, blocks, strict=True)
            ]
            total = sum(len(r.checks) for _, r in results)
            failed = sum(1 for _, r in results for c in r.checks if not c.passed)
            blocks.append(
                "\n".join(
                    [
                        f"Summary: {len(results)} scenario files, {total} checks, {failed} failed",
                        *(
                            f"  {'PASS' if r.passed else 'FAIL'}  {p}  ({r.action_name})"
                            for p, r in results
                        ),
                        "",
                        "Final classification:",
                        SAFE if passed else UNSAFE,
                    ]
                )
            )
        print("\n\n".join(blocks))
    if args.junit_xml:
        try:
            write_owner_only(args.junit_xml, _junit(results))
        except OSError as exc:
            raise UsageProblem(f"cannot write {args.junit_xml}: {exc.strerror}") from exc
    return EXIT_OK if passed else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dataoad`` console script and ``python -m dataoad``."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK if exc.code in (0, None) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command in ("receipts", "recover", "release-unstarted", "reopen", "ledger", "audit"):
        return run_ledger_command(args)
    if args.command == "check":
        return run_check_command(args)
    if args.command == "serve":
        return run_serve_command(args)
    try:
        if args.command == "test":
            return command_test(args)
    except BrokenPipeError:
        # The reader went away (for example ``| head``); that is not our failure.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return EXIT_OK
    except UsageProblem as problem:
        if getattr(args, "debug", False):
            traceback.print_exception(problem)
        print(f"dataoad {args.command}: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    raise AssertionError(f"unhandled command {args.command!r}")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
