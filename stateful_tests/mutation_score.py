"""``python -m stateful_tests.mutation_score``: the mutation score of the safety-critical code.

Runs mutmut on a copy of the checkout (so ``mutants/`` never lands in the
tree) over the given modules, with the unit and stateful tests that cover
them, then prints the raw score, the score after triage, and every
surviving mutant. A survivor listed in ``mutation_equivalents.txt`` (one
line each: the mutant's name, a tab, why it cannot change a safety-relevant
behaviour, a tab, the code the mutant puts in) is triaged while the mutant
still puts in that code; any other survivor makes the exit status 1.

    python -m stateful_tests.mutation_score                       # policy and evidence rules
    python -m stateful_tests.mutation_score --safety-critical     # about an hour on 2 cores
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from stateful_tests.mutation_triage import (
    EQUIVALENTS,
    mutated_code,
    record_mutated_code,
    reviewed,
    stale_triage,
)
from stateful_tests.mutation_verdicts import NOT_RUN, RECHECK_LIMIT, Recheck, run_until, unconfirmed

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODULES = ["dataoad/_policy.py", "dataoad/_evidence.py"]
#: ``--safety-critical``: the runner, its blocking surface and engine step, verifier answers, the
#: embedded ledgers' transitions. The SQLite file's opening, schema set-up and closing
#: are left out (their own tests cover them, and each of their mutants reruns
#: every SQLite test, which alone would take hours).
SAFETY_CRITICAL_MODULES = [
    "dataoad/_runner.py",
    "dataoad/_waiting.py",
    "dataoad/_arguments.py",
    "dataoad/_attempts.py",
    "dataoad/_invoking.py",
    "dataoad/_completing.py",
    "dataoad/_settled.py",
    "dataoad/_recovery.py",
    "dataoad/_observing.py",
    "dataoad/_proven.py",
    "dataoad/_proven_reads.py",
    "dataoad/_records.py",
    "dataoad/_verification.py",
    "dataoad/ledgers/memory.py",
    "dataoad/ledgers/sqlite.py",
    "dataoad/ledgers/_statements.py",
    "dataoad/ledgers/_writer_lock.py",
    "dataoad/ledgers/_sqlite_group.py",
    "dataoad/ledgers/_sqlite_holders.py",
    "dataoad/ledgers/_sqlite_file.py",
    "dataoad/_blocking.py",
    "dataoad/_sync.py",
    "dataoad/integrations/_engine.py",
    "dataoad/_volatile.py",
    "dataoad/_leases.py",
    "dataoad/_ledger_rules.py",
    "dataoad/_ledger_arguments.py",
    "dataoad/_clock.py",
    "dataoad/_current.py",
    "dataoad/_action_ids.py",
]
SAFETY_CRITICAL_MUTANTS = [
    "dataoad._runner.*",
    "dataoad._waiting.*",
    "dataoad._arguments.*",
    "dataoad._attempts.*",
    "dataoad._invoking.*",
    "dataoad._completing.*",
    "dataoad._settled.*",
    "dataoad._recovery.*",
    "dataoad._observing.*",
    "dataoad._proven.*",
    "dataoad._proven_reads.*",
    "dataoad._records.*",
    "dataoad._verification.*",
    "dataoad.ledgers.memory.*",
    "dataoad.ledgers._statements.*",
    "dataoad.ledgers._writer_lock.*",
    "dataoad.ledgers._sqlite_group.*",
    "dataoad.ledgers._sqlite_holders.*",
    # The SQLite ledger's clock, which judges every lease and age.
    "dataoad.ledgers._sqlite_file.x_sqlite_clock__mutmut_*",
    "dataoad.ledgers._sqlite_file.xǁ_SQLiteNowǁ*",
    "dataoad.ledgers._sqlite_file.x_clock_text__mutmut_*",
    "dataoad.ledgers._sqlite_file.xǁClockTextsǁ*",
    "dataoad._blocking.*",
    # The blocking surface: every argument handed on, close's refusals.
    "dataoad._sync.*",
    # Where an engine's at-least-once step meets the runner: its key, checks and call.
    "dataoad.integrations._engine.*",
    # What no front end lets decide a key: one execution's own identifiers.
    "dataoad._volatile.*",
    "dataoad._leases.*",
    "dataoad._ledger_rules.*",
    # Every ledger's door: what it refuses before it writes.
    "dataoad._ledger_arguments.*",
    "dataoad._clock.*",
    "dataoad._current.*",
    "dataoad._action_ids.*",
    *(
        f"dataoad.ledgers.sqlite.{name}__mutmut_*"
        for name in (
            "x__row_of",
            "x__values_of",
            "x__utc_text",
            "x__receipt_of",
            "x__holder",
            "xǁSQLiteLedgerǁ_read",
            "xǁSQLiteLedgerǁ_write",
            "xǁSQLiteLedgerǁ_run",
            "xǁSQLiteLedgerǁ_transition",
            "xǁSQLiteLedgerǁ_params",
            "xǁSQLiteLedgerǁtake_over",
            "xǁSQLiteLedgerǁrenew",
            "xǁSQLiteLedgerǁclaim",
            "xǁSQLiteLedgerǁget",
            "xǁSQLiteLedgerǁfind",
            "xǁSQLiteLedgerǁstart_attempt",
            "xǁSQLiteLedgerǁrecord",
            "xǁSQLiteLedgerǁrelease",
            "xǁSQLiteLedgerǁreceipts",
        )
    ),
]
TESTS = [
    "tests/claim/test_claim_and_replay.py",
    "tests/attempts/test_attempt_start.py",
    "tests/attempts/test_outcome.py",
    "tests/evidence/test_observations.py",
    "tests/evidence/test_values.py",
    "tests/evidence/test_hostile_answers.py",
    "tests/evidence/test_evidence_rules.py",
    "tests/attempts/test_retry_and_aggregation.py",
    "tests/recovery/test_recovery_and_merge.py",
    "tests/recovery/test_recover_pending.py",
    "tests/recovery/test_release.py",
    "tests/evidence/test_execution_evidence.py",
    "tests/attempts/test_persistence_faults.py",
    "tests/ledgers/test_ledger_contract.py",
    "tests/ledgers/test_ledger_arguments.py",
    "tests/ledgers/test_sqlite_ledger.py",
    "tests/ledgers/test_in_memory_ledger.py",
    "tests/claim/test_input_validation.py",
    "tests/claim/test_storable_text.py",
    "tests/ledgers/test_storage_hygiene.py",
    "tests/claim/test_wait_in_progress.py",
    "tests/claim/test_documented_bounds.py",
    "tests/attempts/test_operation_counts.py",
    "tests/attempts/test_call_allocations.py",
    "tests/attempts/test_cancellation.py",
    "tests/front_ends/test_logging.py",
    "tests/front_ends/test_guard.py",
    "tests/front_ends/test_sync_and_threads.py",
    "tests/front_ends/test_sync_surface.py",
    "tests/ledgers/test_sqlite_lock_and_exit.py",
    "tests/recovery/test_recovery_reads.py",
    "tests/front_ends/test_runner_seams.py",
    "tests/ledgers/test_inspection.py",
    "tests/leases/test_leases.py",
    "tests/leases/test_lease_edges.py",
    "tests/leases/test_zombie_and_sweep_rules.py",
    "tests/leases/test_fenced_errors.py",
    "tests/leases/test_takeover_writes.py",
    # Rooms the selection missed until 2026-12-04: the owner's outcome over a
    # zombie's merged evidence, the grouped writer, the lifecycle, the
    # options every front end shares, operator records.
    "tests/leases/test_owner_outcome_after_zombie.py",
    "tests/leases/test_rebase_over_evidence.py",
    "tests/leases/test_late_attempts.py",
    "tests/ledgers/test_sqlite_group_commit.py",
    "tests/ledgers/test_sqlite_connection_thread.py",
    "tests/ledgers/test_close_while_opening.py",
    "tests/ledgers/test_row_encoding.py",
    "tests/lifecycle/test_lifecycle.py",
    "tests/lifecycle/test_retire_writes.py",
    "tests/front_ends/test_execute_options.py",
    "tests/front_ends/test_tool_outcome.py",
    "tests/front_ends/test_close_and_exit.py",
    "tests/front_ends/test_interrupts.py",
    "tests/front_ends/test_fork.py",
    "tests/console/test_operator_audit.py",
    "tests/claim/test_canonical_hash.py",
    "tests/claim/test_action_ids.py",
    "tests/engines/test_engine_step.py",
    "tests/engines/test_engine_options.py",
    "tests/engines/test_temporal.py",
    "stateful_tests/test_runner_machine.py::TestRunnerMachineMemory",
    "stateful_tests/test_merge_machine.py::TestMergeMachineMemory",
    "stateful_tests/test_ledger_machine.py",
    "stateful_tests/test_group_machine.py",
]


#: The rooms whose tests exercise the mutated code: each of their test files
#: is either in ``TESTS`` or here, with why not (checked by
#: ``tests/project/test_suite_shape.py``, so a new file cannot be missed as
#: the owner-after-zombie and grouped-writer tests once were).
SELECTED_ROOMS = [
    "claim",
    "attempts",
    "evidence",
    "recovery",
    "leases",
    "lifecycle",
    "ledgers",
    "front_ends",
]
NOT_SELECTED = {
    "tests/leases/test_clock_skew_processes.py": "the code under test runs in child processes",
    "tests/leases/test_unattended_recovery.py": "the code under test runs in child processes",
    "tests/ledgers/test_client_bounds.py": "the code under test runs in child processes",
    "tests/leases/test_lease_migration.py": "schema migrations, which are not mutated",
    "tests/lifecycle/test_namespace_migration.py": "schema migrations, which are not mutated",
    "tests/lifecycle/test_stored_at_migration.py": "schema migrations, which are not mutated",
    "tests/ledgers/test_durability.py": "the durability report, which is not mutated",
    "tests/front_ends/test_otel.py": "the metrics exporter, which is not mutated",
}
#: The PostgreSQL ledger is not mutated (its transitions are SQL run by the
#: server; the contract suite holds them to the same rules).
NOT_SELECTED_PATTERN = "tests/ledgers/test_postgres_*.py"


#: Tests that cannot run under mutmut. This one drops root privileges in a
#: child process, which then cannot read mutmut's own modules under /root.
DESELECTED = [
    "tests/ledgers/test_sqlite_ledger.py::test_a_read_only_file_surfaces_as_persistence_error"
]


#: Written into every workspace, so that --keep never deletes anything else.
WORKSPACE_MARKER = ".dataoad-mutation-workspace"


#: pytest options for every run against a mutant, by mutmut or by ``recheck``:
#: a 60 s limit per test (a mutant that makes a test wait forever is killed
#: quickly), stop at the first failure, and the tests that cannot run under mutmut.
PYTEST_OPTIONS = [
    "-p",
    "no:cacheprovider",
    "-o",
    "timeout=60",
    "-x",
    "-q",
    *(f"--deselect={t}" for t in DESELECTED),
]


def config(modules: list[str]) -> str:
    quoted = ", ".join(f'"{m}"' for m in modules)
    tests = ", ".join(f'"{t}"' for t in TESTS)
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["dataoad/"]\n'
        f"only_mutate = [{quoted}]\n"
        'also_copy = ["stateful_tests/", "suite_support/", "models/", "conftest.py", "examples/", "fault_scenarios/"]\n'
        f"pytest_add_cli_args = {json.dumps(['-n', '0', *PYTEST_OPTIONS])}\n"
        f"pytest_add_cli_args_test_selection = [{tests}]\n"
    )


def recheck(
    workspace: Path, name: str, env: dict[str, str], limit: float = RECHECK_LIMIT
) -> Recheck:
    """Whether ``name`` fails the example tests when they all run against it.

    mutmut runs, for each mutant, only the tests it saw calling the mutated
    function. That misses code run at import (a statement built once when
    its module loads) and code a racy test reaches only sometimes; so every
    survivor not already reviewed runs against every example test here.
    A run that passes ``limit`` is stopped, with its workers: a test that
    failed before then is a kill, a hang alone is not.
    """
    examples = [t for t in TESTS if t.startswith("tests/")]
    return run_until(
        [sys.executable, "-m", "pytest", "-n", "2", *PYTEST_OPTIONS, *examples],
        cwd=workspace / "mutants",
        env={**env, "MUTANT_UNDER_TEST": name},
        limit=limit,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stateful_tests.mutation_score", fromfile_prefix_chars="@"
    )
    parser.add_argument("--modules", nargs="+", default=DEFAULT_MODULES)
    parser.add_argument(
        "--safety-critical",
        action="store_true",
        help="the runner, verifier answers and ledger transitions (about an hour on 2 cores)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="work in DIR and keep it, so `mutmut show NAME` can be run there afterwards",
    )
    parser.add_argument(
        "--no-recheck",
        action="store_true",
        help="list survivors without running every example test against each (a quick look at "
        "one module; the score it prints is lower than a full run's)",
    )
    parser.add_argument(
        "--recheck-limit",
        type=float,
        default=RECHECK_LIMIT,
        metavar="SECONDS",
        help=f"stop a recheck after this long (default {RECHECK_LIMIT:.0f}); a hang is not a kill",
    )
    parser.add_argument(
        "--record-mutated-code",
        type=Path,
        metavar="DIR",
        help="write into the triage file, for each entry without it, the code its mutant puts "
        "in, read from the kept workspace DIR (check each against its reason), and run nothing",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="run and score only the mutants with these names or glob patterns (@FILE reads "
        "them one per line), such as the ones a stopped run never reached",
    )
    parser.add_argument(
        "--rescore",
        type=Path,
        metavar="DIR",
        help="score the kept workspace DIR of a run that finished or was stopped, without "
        "running mutmut again (mutmut does not resume); mutants it never ran are counted apart",
    )
    args = parser.parse_args()
    if args.record_mutated_code:
        added = record_mutated_code(args.record_mutated_code.resolve(), dict(os.environ))
        print(f"recorded the mutated code of {added} triaged mutants in {EQUIVALENTS.name}")
        return 0
    patterns: list[str] = []
    if args.safety_critical:
        args.modules, patterns = SAFETY_CRITICAL_MODULES, SAFETY_CRITICAL_MUTANTS
    if args.only:
        patterns = args.only
    if args.rescore:
        copy = args.rescore.resolve()
        if not (copy / WORKSPACE_MARKER).exists() or not (copy / "mutants").is_dir():
            print(f"{copy} is not a kept mutation workspace", file=sys.stderr)
            return 2
        return score(copy, run_env(), args, patterns)
    with tempfile.TemporaryDirectory(prefix="dataoad-mutation-") as folder:
        copy = args.keep.resolve() if args.keep else Path(folder) / "repo"
        if copy.exists():
            # Only ever delete a workspace this command made (never, say, ".").
            if not (copy / WORKSPACE_MARKER).exists():
                print(f"{copy} exists and is not a mutation workspace", file=sys.stderr)
                return 2
            shutil.rmtree(copy)
        shutil.copytree(
            ROOT, copy, ignore=shutil.ignore_patterns(".git", "mutants", ".hypothesis", "*.pyc")
        )
        (copy / WORKSPACE_MARKER).touch()
        with (copy / "pyproject.toml").open("a") as handle:
            handle.write(config(args.modules))
        env = run_env()
        run = subprocess.run(
            ["mutmut", "run", *patterns],
            cwd=copy,
            env=env,
            check=False,
            capture_output=True,
            text=True,
        )
        # The whole output, for a failed run's first error (kept with --keep).
        (copy / "mutmut-run.log").write_text(run.stdout + run.stderr)
        if run.returncode != 0:
            print(f"mutmut run failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}", file=sys.stderr)
            return 2
        return score(copy, env, args, patterns)


def run_env() -> dict[str, str]:
    """The environment of every test run: the dev profile and one PostgreSQL server.

    The server is started here: a test that started its own inside mutmut's
    process would leave it a child that mutmut does not know (its worker
    bookkeeping then fails).
    """
    from dataoad.testing._postgres_server import shared_test_dsn

    return {
        **os.environ,
        "HYPOTHESIS_PROFILE": "dev",
        "DATAOAD_TEST_POSTGRES_DSN": shared_test_dsn(),
    }


def score(copy: Path, env: dict[str, str], args: argparse.Namespace, patterns: list[str]) -> int:
    """Print the score of the workspace ``copy`` after rechecking its unconfirmed mutants."""
    results = subprocess.run(
        ["mutmut", "results", "--all", "true"],
        cwd=copy,
        env=env,
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    statuses = dict(re.findall(r"^\s*(\S+): (\w[\w ]*)$", results, re.M))
    if patterns:
        statuses = {
            name: status
            for name, status in statuses.items()
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
        }
    # A run that was stopped never ran some: they are neither kills nor
    # survivors, and the score says it covers only what ran.
    not_run = sorted(n for n, status in statuses.items() if status == NOT_RUN)
    statuses = {n: status for n, status in statuses.items() if status != NOT_RUN}
    known = reviewed()
    # A mutant no test even ran is as unnoticed as one that survived them.
    # So is one mutmut stopped on its CPU limit ("timeout"): the limit is
    # drawn from the tests' durations in its first run, and a slow room
    # (the engines') passes it with a mutant every test lets through.
    # Only a failed test is a kill, so each is rechecked like a survivor.
    unnoticed = unconfirmed(statuses)
    stale = stale_triage(known, {n: mutated_code(copy, n, env) for n in unnoticed if n in known})
    trusted = {n: t for n, t in known.items() if n not in stale}
    verdicts: dict[str, Recheck] = {}
    for name in sorted(unnoticed):
        if name not in trusted and not args.no_recheck:
            verdicts[name] = recheck(copy, name, env, args.recheck_limit)
            # As it goes, so a run that dies still leaves what it found.
            with (copy / "recheck.log").open("a") as log:
                log.write(f"{name}\t{verdicts[name]}\n")
    rechecked = [n for n, verdict in verdicts.items() if verdict.killed]
    total = len(statuses)
    survivors = sorted(set(unnoticed) - set(rechecked))
    killed = total - len(survivors)
    triaged = [s for s in survivors if s in trusted]
    open_ = [s for s in survivors if s not in trusted]
    if not total:
        print("mutmut produced no results", file=sys.stderr)
        return 2
    print(f"modules: {', '.join(args.modules)}")
    if not_run:
        print(f"NOT RUN: {len(not_run)} mutants (the run was stopped); the scores cover the rest")
    print(
        f"mutants: {total}, killed: {killed} ({len(rechecked)} of them only when rechecked "
        f"against every example test), survived: {len(survivors)}"
    )
    print(f"raw score: {killed / total:.2%}")
    for name in rechecked:
        print(f"  rechecked   {name}: killed by the example tests mutmut did not select")
    print(
        f"after triage ({len(triaged)} reviewed as equivalent): {(killed + len(triaged)) / total:.2%}"
    )
    for name in triaged:
        print(f"  equivalent  {name}: {trusted[name].reason}")
    for name in open_:
        notes = [stale[name]] if name in stale else []
        if statuses[name] not in ("survived", "no tests"):
            notes.append(f"mutmut: {statuses[name]}, not confirmed by a failed test")
        if name in verdicts and verdicts[name].hung:
            notes.append(f"the recheck hung past {args.recheck_limit:.0f} s and was stopped")
        print(f"  SURVIVED    {name}" + (f" ({'; '.join(notes)})" if notes else ""))
    return 1 if open_ or not_run else 0


if __name__ == "__main__":
    raise SystemExit(main())
