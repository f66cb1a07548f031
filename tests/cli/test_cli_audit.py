"""The audit on the command line: ``--operator``/``--reason`` on the verbs, ``dataoad audit``,
and the records below ``receipts show``; SQLite and PostgreSQL, run as a person runs them."""

from __future__ import annotations

import getpass
import json
import time
from pathlib import Path

from suite_support.cli import VERIFIER, Store, charges, dataoad, listing


def audit(s: Store, *args: str) -> list[dict[str, object]]:
    done = dataoad("audit", "--json", *args, cwd=s.cwd, env=s.env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_each_verb_names_its_operator_and_reason_and_show_lists_them(store: Store) -> None:
    env, cwd = store.env, store.cwd
    unknown_id = str(listing(store, "--status", "UNKNOWN")[0]["action_id"])
    recovered = dataoad(
        "recover", unknown_id, "--verifier", "ops_verifier:Confirms", "--yes",
        "--operator", "ana", "--reason", "INC-42: provider dashboard shows the charge",
        cwd=cwd, env=env,
    )  # fmt: skip
    assert recovered.returncode == 0, recovered.stderr
    stranded_id = str(listing(store, "--pending")[0]["action_id"])
    released = dataoad("release-unstarted", stranded_id, "--yes", cwd=cwd, env=env)
    assert released.returncode == 0, released.stderr
    records = audit(store)
    assert [(r["verb"], r["action_id"], r["outcome"]) for r in records] == [
        ("release_unstarted", stranded_id, "released"),
        ("recover", unknown_id, "CONFIRMED"),
    ]
    assert records[0]["operator"] == getpass.getuser()  # the default
    assert records[1]["operator"] == "ana"
    assert records[1]["reason"] == "INC-42: provider dashboard shows the charge"
    # receipts show lists the same records, as text and as JSON.
    shown = dataoad("receipts", "show", unknown_id, cwd=cwd, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "ana@" in shown.stdout
    assert "recover " + unknown_id + ": CONFIRMED" in shown.stdout
    as_json = dataoad("receipts", "show", unknown_id, "--json", cwd=cwd, env=env)
    assert json.loads(as_json.stdout)["operator_records"] == [records[1]]
    # Filters.
    assert audit(store, "--operator", "ana") == [records[1]]
    assert audit(store, "--action-id", stranded_id) == [records[0]]
    assert audit(store, "--limit", "1") == [records[0]]
    assert audit(store, "--since", "2999-01-01T00:00:00+00:00") == []
    assert audit(store, "--namespace", "") == records
    assert audit(store, "--namespace", "elsewhere") == []
    text = dataoad("audit", cwd=cwd, env=env)
    assert text.returncode == 0
    assert "INC-42" in text.stdout


def test_a_bad_operator_or_filter_is_a_usage_error_and_changes_nothing(store: Store) -> None:
    env, cwd = store.env, store.cwd
    unknown_id = str(listing(store, "--status", "UNKNOWN")[0]["action_id"])
    before = listing(store, "--all")
    for flags in (("--operator", ""), ("--operator", "a\tb"), ("--reason", "x" * 2001)):
        done = dataoad(
            "recover", unknown_id, "--verifier", "ops_verifier:Confirms", "--yes", *flags,
            cwd=cwd, env=env,
        )  # fmt: skip
        assert done.returncode in (1, 2), done.stderr
        assert "operator" in done.stderr or "reason" in done.stderr
        assert done.stderr.count("\n") == 1  # one line
    assert listing(store, "--all") == before
    assert audit(store) == []
    for flags in (("--limit", "0"), ("--limit", "100001"), ("--since", "yesterday"),
                  ("--since", "2026-01-01T00:00:00")):  # fmt: skip
        done = dataoad("audit", *flags, cwd=cwd, env=env)
        assert done.returncode == 2, (flags, done.stderr)


def test_prune_is_audited_and_its_records_outlive_what_it_deleted(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    charges(path, 3)
    (tmp_path / "ops_verifier.py").write_text(VERIFIER)
    env = {"DATAOAD_LEDGER": str(path)}
    nothing = dataoad(
        "receipts", "prune", "--older-than", "1h", "--yes", "--operator", "retention-job",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    # Nothing that old: nothing deleted, and nothing recorded.
    assert nothing.returncode == 0, nothing.stderr
    assert "nothing to prune" in nothing.stdout
    time.sleep(1.1)
    pruned = dataoad(
        "receipts", "prune", "--older-than", "1s", "--yes", "--operator", "retention-job",
        "--reason", "policy: 1 second", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert pruned.returncode == 0, pruned.stderr
    assert "deleted 3" in pruned.stdout
    done = dataoad("audit", "--json", cwd=tmp_path, env=env)
    (record,) = json.loads(done.stdout)
    assert record["verb"] == "prune"
    assert record["action_id"] is None
    assert record["operator"] == "retention-job"
    assert record["outcome"].startswith("deleted 3 CONFIRMED,FAILED receipt(s) stored before ")
    assert record["reason"] == "policy: 1 second"
    assert dataoad("receipts", "list", "--json", cwd=tmp_path, env=env).stdout.strip() == "[]"


def test_audit_on_a_file_this_user_may_only_read(tmp_path: Path) -> None:
    """``dataoad audit`` reads through the read-only reader: it writes nothing."""
    path = tmp_path / "ledger.sqlite3"
    charges(path, 1)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    done = dataoad("audit", "--ledger", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no operator records match" in done.stdout
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
