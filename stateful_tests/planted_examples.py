"""Planted bugs that example tests must catch: configuration, discipline and front ends.

The state machines hunt bugs in the protocol. Some rules are not about
interleavings at all (a default, a file mode, which bytes are hashed, where
a statement runs relative to a lock, what a front end hands the runner),
and a search would only find them by luck. Each bug here is a small source
change, written as someone who had read the README but not the tests might
write it, with the example tests that must fail because of it.
``test_planted_examples.py`` applies each one to a copy of the checkout and
runs exactly those tests there.

Several of these passed every test when they were first written (see
``stateful_tests/README.md``, "Planted bugs for example tests"); the tests
named here were added or strengthened until each fails.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What a copy needs to run the example tests.
COPIED = (
    "dataoad",
    "tests",
    "stateful_tests",
    "suite_support",
    "models",
    "examples",
    "fault_scenarios",
)
COPIED_FILES = ("conftest.py", "pyproject.toml", "README.md")


def copy_checkout(into: Path) -> Path:
    """What the example tests need of the checkout, copied to ``into / "planted"``."""
    copy = into / "planted"
    for folder in COPIED:
        # Compiled modules come along (each keeps its source's time and size,
        # so Python checks them as in the checkout): each copy's child pytest
        # would otherwise compile every module again.
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns(".hypothesis"))
    for name in COPIED_FILES:
        shutil.copy2(ROOT / name, copy / name)
    return copy


@dataclasses.dataclass(frozen=True)
class PlantedExample:
    """One bug: replace ``old`` (which occurs exactly once) by ``new`` in ``path``."""

    name: str
    rule: str  # the promise it breaks, in words
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # node ids; at least one must fail
    needs_postgres: bool = False

    def plant(self, into: Path) -> Path:
        """A copy of the checkout in ``into`` with this bug in it."""
        copy = copy_checkout(into)
        target = copy / self.path
        source = target.read_text()
        if source.count(self.old) != 1:
            raise AssertionError(
                f"planted example {self.name}: the code it changes moved "
                f"({source.count(self.old)} matches in {self.path}); rewrite it"
            )
        target.write_text(source.replace(self.old, self.new))
        # Its compiled form is the unplanted code's: never to be taken for it.
        for stale in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
            stale.unlink()
        return copy


PLANTED_EXAMPLES = [
    PlantedExample(
        "sqlite-defaults-to-normal",
        "a new SQLite ledger is synchronous=FULL unless asked otherwise",
        "dataoad/ledgers/sqlite.py",
        'synchronous: Synchronous = "FULL",',
        'synchronous: Synchronous = "NORMAL",',
        ("tests/ledgers/test_sqlite_lock_and_exit.py::test_a_new_ledger_is_durable_by_default",),
    ),
    PlantedExample(
        "sqlite-writes-after-the-lock",
        "every SQLite write statement runs while the cross-process writer lock is held",
        "dataoad/ledgers/_sqlite_group.py",
        "                    if group:\n                        self._run(db, group)\n",
        "                if group:\n                    self._run(db, group)\n",
        (
            "tests/ledgers/test_sqlite_lock_and_exit.py"
            "::test_every_write_statement_runs_while_the_writer_lock_is_held",
        ),
    ),
    PlantedExample(
        "sqlite-file-readable-by-all",
        "a new SQLite file is readable by its owner only",
        "dataoad/ledgers/_sqlite_file.py",
        "os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600",
        "os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644",
        ("tests/ledgers/test_sqlite_ledger.py::test_new_files_are_readable_by_their_owner_only",),
    ),
    PlantedExample(
        "postgres-asynchronous-commit",
        "the PostgreSQL ledger never lowers synchronous_commit",
        "dataoad/ledgers/_postgres_pooler.py",
        'settings = {} if pooled else {"application_name": "dataoad"}',
        'settings = {} if pooled else {"application_name": "dataoad", "synchronous_commit": "off"}',
        (
            "tests/ledgers/test_postgres_schema.py"
            "::test_each_step_is_one_autocommit_statement_and_commits_are_synchronous",
        ),
        needs_postgres=True,
    ),
    PlantedExample(
        "hash-of-nfc-text",
        "the request hash is SHA-256 of the RFC 8785 bytes, text kept exactly as sent",
        "dataoad/_canonical.py",
        "return hashlib.sha256(canonical).hexdigest()",
        "text = canonical.decode()\n"
        '    nfc = __import__("unicodedata").normalize("NFC", text)\n'
        "    return hashlib.sha256(nfc.encode()).hexdigest()",
        (
            "tests/claim/test_claim_and_replay.py"
            "::test_request_hash_matches_rfc8785_vectors_another_language_computes",
        ),
    ),
    PlantedExample(
        "guarded-sync-function-called-at-once",
        "guarded hands the runner the function uncalled: nothing runs before the claim",
        "dataoad/_guard.py",
        "        # ``fn`` is handed over uncalled: the runner calls it after the claim.\n"
        "        return sync_runner.execute(\n"
        "            guard.action_name,\n"
        "            functools.partial(fn, *args, **kwargs),",
        "        value = fn(*args, **kwargs)\n"
        "        return sync_runner.execute(\n"
        "            guard.action_name,\n"
        "            lambda: value,",
        (
            "tests/front_ends/test_guard.py"
            "::test_decorator_on_a_sync_function_with_a_sync_runner_is_sync_and_guards_calls",
        ),
    ),
    PlantedExample(
        "recover-settles-unstarted-claims",
        "recovery refuses a claim that never started an attempt (release it instead)",
        "dataoad/_recovery.py",
        "    elif receipt.attempts == 0:\n        raise RecoveryRefusedError(",
        "    elif receipt.attempts == 0 and False:\n        raise RecoveryRefusedError(",
        ("tests/recovery/test_recover_pending.py::test_recover_pending_refuses_unstarted_claims",),
    ),
    PlantedExample(
        "verifier-value-stored",
        "provider values are never persisted, only what the receipt needs",
        "dataoad/_observing.py",
        "    details = _kept_details(result.details)\n",
        "    details = {**(result.details or {}), 'value': repr(result.value)}\n",
        (
            "tests/ledgers/test_storage_hygiene.py::test_raw_request_and_provider_values_are_never_stored",
        ),
    ),
    PlantedExample(
        "tool-says-not-attempted-after-an-attempt",
        "run_tool never tells the model 'not attempted' about a claim that counted an attempt",
        "dataoad/_tool.py",
        "exc.operation_invoked or (receipt is not None and receipt.attempts > 0)",
        "exc.operation_invoked",
        (
            "tests/front_ends/test_tool_outcome.py"
            "::test_an_unrecorded_check_of_an_attempted_action_is_never_not_attempted",
        ),
    ),
    PlantedExample(
        "guarded-tool-drops-policy",
        "GuardedTool runs the tool under the policy it was given",
        "dataoad/_tool.py",
        "            verifier=self.verifier,\n            policy=self.policy,\n",
        "            verifier=self.verifier,\n",
        (
            "tests/front_ends/agents/test_front_end_matrix.py"
            "::test_the_guards_policy_retries_a_retry_safe_rejection[GuardedTool.call-async]",
        ),
    ),
    PlantedExample(
        "guarded-tool-key-from-every-argument",
        "a tool's key comes from the intent the caller declares, so a changed request conflicts",
        "dataoad/_tool.py",
        "return given(**kwargs)\n",
        "return given(**kwargs) + str(sorted(kwargs.items()))[:40]\n",
        (
            "tests/front_ends/agents/test_front_end_matrix.py"
            "::test_a_reused_key_with_another_request_is_a_conflict[GuardedTool.call-sync]",
        ),
    ),
    PlantedExample(
        "temporal-key-from-the-attempt",
        "an activity's key is the same on every attempt (never the attempt number)",
        "dataoad/integrations/temporal.py",
        'return engine_key("temporal", info.namespace, info.workflow_id or "", info.activity_id)',
        'return engine_key("temporal", info.namespace, info.workflow_id or "", info.activity_id,'
        " str(info.attempt))",
        (
            "tests/engines/test_temporal.py"
            "::test_worker_killed_then_temporal_retries_the_activity[after_commit-verifier]",
        ),
    ),
    PlantedExample(
        "dbos-step-retries-on",
        "DBOS never retries a guarded step: an UNKNOWN is not a transient error",
        "dataoad/integrations/dbos.py",
        "retries_allowed=False",
        "retries_allowed=True, interval_seconds=0.01",
        (
            "tests/engines/test_dbos_step.py"
            "::test_unknown_reaches_the_workflow_as_unresolved_and_dbos_does_not_retry",
        ),
    ),
    PlantedExample(
        "engine-unknown-returned",
        "an engine step's UNKNOWN reaches the workflow as UnresolvedActionError, never a value",
        "dataoad/integrations/_engine.py",
        "            raise unresolved(result, self.engine)\n",
        "            pass\n",
        (
            "tests/engines/test_dbos_crashes.py"
            "::test_guarded_step_on_dbos_postgres_system_database[False]",
            "tests/engines/test_dbos_step.py"
            "::test_unknown_reaches_the_workflow_as_unresolved_and_dbos_does_not_retry",
        ),
        needs_postgres=True,
    ),
    PlantedExample(
        "langgraph-key-from-the-task-id",
        "a node's key survives a checkpoint lost in the crash (the task's id does not)",
        "dataoad/integrations/langgraph.py",
        'return engine_key("langgraph", thread, str(step), "/".join(str(p) for p in path))',
        'return engine_key("langgraph", thread, namespace)',
        (
            "tests/engines/test_langgraph.py"
            "::test_a_checkpoint_lost_in_the_crash_leaves_the_key_unchanged[True]",
        ),
    ),
    PlantedExample(
        "postgres-commit-local-under-failover",
        "a claim acknowledged by a primary with a synchronous standby survives its failover",
        "dataoad/ledgers/_postgres_pooler.py",
        'settings = {} if pooled else {"application_name": "dataoad"}',
        'settings = {} if pooled else {"application_name": "dataoad", "synchronous_commit": "local"}',
        (
            "tests/ledgers/test_postgres_failover.py"
            "::test_with_synchronous_replication_a_failover_loses_nothing_and_charges_nothing_twice",
        ),
    ),
    PlantedExample(
        "postgres-proves-a-commit-the-primary-alone-holds",
        "a write ended while its commit waited for a synchronous standby is never proven from the primary's copy alone",
        "dataoad/ledgers/_postgres_backend.py",
        "        return self._settled < self._doubts\n",
        "        return False\n",
        (
            "tests/ledgers/test_postgres_write_in_doubt.py"
            "::test_a_commit_waiting_for_a_standby_is_neither_proven_nor_taken_for_absent",
        ),
    ),
    PlantedExample(
        "sqlite-read-answered-through-a-closed-loop",
        "a read whose caller's loop closed before its answer leaves the ledger's connection serving",
        "dataoad/ledgers/_sqlite_live.py",
        "    queue_on_thread(conn, run)\n    return await answered\n",
        "    return await conn._execute(fn)  # type: ignore[no-any-return]\n",
        (
            "tests/ledgers/test_sqlite_connection_thread.py"
            "::test_a_read_whose_loop_closed_before_its_answer_leaves_the_ledger_serving",
        ),
    ),
    PlantedExample(
        "sqlite-too-big-value-fails-its-group",
        "one caller's value over SQLite's length limit fails its own write alone",
        "dataoad/ledgers/_sqlite_group.py",
        "    sqlite3.DataError,  # a value over SQLite's length limit (SQLITE_TOOBIG)\n",
        "",
        ("tests/ledgers/test_sqlite_group_commit.py::test_a_statement_that_raises_fails_alone",),
    ),
    PlantedExample(
        "stop-iteration-into-a-future",
        "a sync operation that raises StopIteration is recorded UNKNOWN, never left hanging",
        "dataoad/_blocking.py",
        "        future.set_exception(storable_in_a_future(exc))\n",
        "        future.set_exception(exc)\n",
        (
            "tests/evidence/test_hostile_answers.py"
            "::test_a_sync_operation_raising_stop_iteration_is_recorded_unknown",
        ),
    ),
    PlantedExample(
        "verifier-handed-the-runners-receipt",
        "a decisive verifier result is bound to the receipt's own provider reference",
        "dataoad/_observing.py",
        "        result = await verify(_handed_over(receipt))\n",
        "        result = await verify(receipt)\n",
        (
            "tests/evidence/test_hostile_answers.py"
            "::test_a_verifier_that_changes_the_receipt_it_is_handed_changes_nothing",
        ),
    ),
    # v0.3 surfaces, written from outside without reading the tests (#42):
    # of 20 such changes, the ones on engines, PostgreSQL, the audit and the console.
    PlantedExample(
        "intent-key-order-swapped",
        "intent_key is the SHA-256 of RFC 8785 [scope, action, request] (docs/how-to/engines/index.md)",
        "dataoad/_intent.py",
        "    canonical = rfc8785.dumps([scope, action_name, request])\n",
        "    canonical = rfc8785.dumps([action_name, scope, request])\n",
        ("tests/engines/test_intent_key.py::test_fixed_vectors",),
    ),
    PlantedExample(
        "engine-lease-wait-not-doubled",
        "a re-executed engine step waits twice the lease plus 5 s for a dead worker's claim (docs/how-to/engines/dbos.md)",
        "dataoad/integrations/_engine.py",
        "min(2 * lease + 5, MAX_WAIT_IN_PROGRESS)",
        "min(lease + 5, MAX_WAIT_IN_PROGRESS)",
        ("tests/engines/test_engine_step.py",),
    ),
    PlantedExample(
        "engine-replayed-unknown-returned",
        "in every engine an UNKNOWN reaches the workflow as UnresolvedActionError, a replayed one too",
        "dataoad/integrations/_engine.py",
        "        if result.status is ActionStatus.UNKNOWN:\n",
        "        if result.status is ActionStatus.UNKNOWN and not result.replayed:\n",
        (
            "tests/engines/test_temporal.py::test_an_ambiguous_attempt_is_not_retried_and_a_retry_anyway_charges_nothing",
        ),
    ),
    PlantedExample(
        "langgraph-task-key-uses-task-id",
        "a node's default key survives a checkpoint lost in the crash",
        "dataoad/integrations/langgraph.py",
        '    return engine_key("langgraph", thread, str(step), "/".join(str(p) for p in path))\n',
        '    return engine_key("langgraph", thread, namespace, str(step), "/".join(str(p) for p in path))\n',
        (
            "tests/engines/test_langgraph.py::test_worker_killed_then_resumed_from_the_sqlite_checkpoint[after_claim-verifier-ainvoke]",
        ),
    ),
    PlantedExample(
        "pgbouncer-statement-cache-kept",
        "PostgresLedger keeps no server-side state across transactions behind PgBouncer",
        "dataoad/ledgers/_postgres_pooler.py",
        '        **({"statement_cache_size": 0} if pooled else {}),\n',
        "",
        (
            "tests/ledgers/test_postgres_contract.py::TestPostgresLedgerThroughPgBouncer::test_one_winner_among_concurrent_claims",
        ),
        needs_postgres=True,
    ),
    PlantedExample(
        "cancelled-thread-settled-at-its-fence",
        "a call cancelled while what its operation started may still act leaves its claim held",
        "dataoad/_attempts.py",
        "            if acting.may_act:\n",
        "            if not acting:\n",
        (
            "tests/attempts/test_cancellation.py::test_a_cancelled_call_whose_thread_still_runs_stays_held_until_fenced",
            "tests/front_ends/test_sync_and_threads.py::test_cancelling_execute_while_a_sync_operation_runs_leaves_the_claim_held",
        ),
    ),
    PlantedExample(
        "postgres-claim-rerun-taken-by-action-id",
        "a claim re-run after a lost answer is the call's own only while it is the receipt written",
        "dataoad/ledgers/_postgres_claim.py",
        "        return proves(receipt_of(stored), receipt)\n",
        "        return True\n",
        (
            "tests/ledgers/test_postgres_faults.py::test_a_lost_claim_acknowledgement_whose_claim_was_taken_over_invokes_nothing",
        ),
        needs_postgres=True,
    ),
    PlantedExample(
        "durability-potential-standby-counted-sync",
        "durability() is unsafe without a synchronous standby; a potential one is not",
        "dataoad/ledgers/_durability.py",
        'SYNCHRONOUS_STATES: Final = frozenset({"sync", "quorum"})\n',
        'SYNCHRONOUS_STATES: Final = frozenset({"sync", "quorum", "potential"})\n',
        ("tests/ledgers/test_durability.py::test_every_postgres_rule_on_both_sides",),
    ),
    PlantedExample(
        "audit-default-namespace-filter-ignored",
        'audit(namespace="") lists the default namespace\'s records only',
        "dataoad/ledgers/_audit.py",
        "            if value is not None:\n                conditions.append(test)\n",
        "            if value:\n                conditions.append(test)\n",
        (
            "tests/console/test_operator_audit.py::test_the_listing_filters_at_its_exact_bounds[sqlite]",
        ),
    ),
    PlantedExample(
        "audit-limit-keeps-oldest",
        "audit(limit=N) lists the newest N",
        "dataoad/ledgers/_audit.py",
        "    return found if limit is None else found[:limit]\n",
        "    return found if limit is None else found[-limit:]\n",
        ("tests/console/test_operator_audit.py::test_a_prune_through_the_api_is_audited[memory]",),
    ),
    PlantedExample(
        "receipt-operator-records-keep-oldest",
        "a receipt carries its newest 100 operator records",
        "dataoad/ledgers/_codec.py",
        "    return json_text(items[-MAX_RECEIPT_OPERATOR_RECORDS:])\n",
        "    return json_text(items[:MAX_RECEIPT_OPERATOR_RECORDS])\n",
        (
            "tests/console/test_operator_audit.py::test_a_receipt_carries_its_newest_records_and_the_audit_all[sqlite]",
        ),
    ),
    PlantedExample(
        "console-age-by-host-clock",
        "the console ages receipts by the ledger's clock (docs: console)",
        "dataoad/_console/data.py",
        "    now = await ledger_now(ledger)\n",
        "    now = utc_now()\n",
        (
            "tests/console/test_console.py::test_the_queue_ages_receipts_by_the_ledger_clock_not_this_hosts",
        ),
    ),
    PlantedExample(
        "console-remote-readonly-without-token",
        "the console binds beyond loopback only with --allow-remote and a token",
        "dataoad/_console/security.py",
        '        if token is None:\n            raise ValueError("--allow-remote needs a token: set DATAOAD_CONSOLE_TOKEN")\n',
        '        if token is None and allow_actions:\n            raise ValueError("--allow-remote needs a token: set DATAOAD_CONSOLE_TOKEN")\n',
        ("tests/console/test_console.py::test_the_bind_rules",),
    ),
    PlantedExample(
        "console-csrf-missing-accepted",
        "every console action needs the CSRF token",
        "dataoad/_console/app.py",
        "        if not isinstance(given, str) or not same_secret(given, csrf):\n",
        "        if isinstance(given, str) and not same_secret(given, csrf):\n",
        (
            "tests/console/test_console.py::test_an_action_needs_the_token_and_the_csrf_token_and_is_audited[sqlite]",
        ),
    ),
    # Boundary rules (#42): each bound's limit moved by one step.
    PlantedExample(
        "wait-sleeps-past-its-deadline",
        "wait_in_progress waits at most its seconds, then raises (README)",
        "dataoad/_waiting.py",
        "        await clock.sleep(min(delay, remaining))\n",
        "        await clock.sleep(delay)\n",
        (
            "tests/claim/test_wait_in_progress.py::test_waiting_backs_off_by_doubling_and_stops_at_the_deadline",
        ),
    ),
    PlantedExample(
        "renewed-twice-per-lease",
        "a lease is renewed three times per lease, so it survives two lost renewals (docs/concepts/leases.md)",
        "dataoad/_leases.py",
        "RENEWALS_PER_LEASE: Final = 3\n",
        "RENEWALS_PER_LEASE: Final = 2\n",
        ("tests/leases/test_leases.py::test_a_lease_is_renewed_three_times_per_lease",),
    ),
    PlantedExample(
        "request-bound-exclusive",
        "a request of exactly max_request_bytes is accepted; one byte more is refused",
        "dataoad/_canonical.py",
        "    if max_bytes is not None and len(canonical) > max_bytes:\n",
        "    if max_bytes is not None and len(canonical) >= max_bytes:\n",
        (
            "tests/claim/test_documented_bounds.py::test_a_request_is_bounded_in_utf8_bytes_not_characters",
        ),
    ),
    PlantedExample(
        "busy-timeout-bounds-exclusive",
        "SQLiteLedger takes a busy_timeout in [0, 3600]",
        "dataoad/ledgers/sqlite.py",
        "not 0 <= busy_timeout <= 3600",
        "not 0 < busy_timeout < 3600",
        (
            "tests/claim/test_documented_bounds.py::test_a_busy_timeout_at_its_limit_is_accepted_and_one_step_past_refused",
        ),
    ),
    PlantedExample(
        "error-cut-at-its-bound",
        "an error of at most 1,000 characters is kept whole (API.md)",
        "dataoad/_receipt.py",
        "    if len(text) > MAX_ERROR_LENGTH:\n",
        "    if len(text) >= MAX_ERROR_LENGTH:\n",
        (
            "tests/claim/test_documented_bounds.py::test_an_error_of_exactly_the_bound_is_kept_whole_and_one_more_is_cut",
        ),
    ),
    PlantedExample(
        "retry-started-over-a-zombies-success",
        "no new attempt starts over durable evidence that an earlier attempt may have taken "
        "effect (a fenced worker's success merged in before the holder's retry started)",
        "dataoad/_settled.py",
        "    if aggregate_attempts(earlier) is not ActionStatus.FAILED:\n",
        "    if aggregate_attempts(earlier) is None:\n",
        (
            "tests/leases/test_owner_outcome_after_zombie.py::test_the_holders_retry_starts_over_a_zombies_evidence_only_while_it_allows_one",
        ),
    ),
    PlantedExample(
        "value-kept-over-a-zombies-other-charge",
        "a value is withheld when it cannot be correlated to the retained provider request id "
        "(the holder's own value, once a fenced worker's confirmation of another charge is "
        "folded into its outcome)",
        "dataoad/_completing.py",
        "    if recorded is not final:\n",
        "    if recorded is not final and recorded.final_status is not final.final_status:\n",
        (
            "tests/leases/test_owner_outcome_after_zombie.py::test_the_owners_value_is_withheld_once_a_zombies_other_charge_is_folded_in",
        ),
    ),
    PlantedExample(
        "release-reported-when-the-claim-is-gone",
        "a release is reported only when proven: one whose write raised and whose claim is gone "
        "may have been another writer's (a release, or a prune after another worker ran it)",
        "dataoad/_proven.py",
        "        if write.proven and write.error is None:\n",
        "        if write.proven:\n",
        (
            "tests/recovery/test_release.py::test_a_failed_release_is_not_reported_when_the_claim_went_another_way",
            "tests/recovery/test_release.py::test_an_unacknowledged_release_is_settled_by_reading_back",
        ),
    ),
]
