"""Operator commands against real SQLite files, run as a person runs them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dataoad.ledgers.postgres import SCHEMA_VERSION as PG_SCHEMA
from dataoad.ledgers.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA
from suite_support.cli import Store, as_nobody, charges, dataoad, listing, read_only_copy
from suite_support.services import PostgresTestTable

ROOT = Path(__file__).resolve().parents[2]


def test_list_filters_and_table(store: Store) -> None:
    assert len(listing(store)) == 3
    unknown = listing(store, "--status", "UNKNOWN")
    assert [r["idempotency_key"] for r in unknown] == ["order-1"]
    pending = listing(store, "--pending")
    assert [r["idempotency_key"] for r in pending] == ["order-3"]
    assert [r["action_name"] for r in listing(store, "--action", "refund")] == ["refund"]
    assert listing(store, "--since", "2999-01-01") == []
    assert len(listing(store, "--since", "2000-01-01T00:00:00+02:00")) == 3
    assert len(listing(store, "--limit", "2")) == 2
    table = dataoad("receipts", "list", cwd=store.cwd, env=store.env)
    assert table.returncode == 0
    assert "(3 receipts)" in table.stdout
    assert "UNKNOWN" in table.stdout


def test_list_shows_the_newest_first_a_bounded_page_and_says_when_more_match(
    store: Store,
) -> None:
    everything = listing(store, "--all")
    assert len(everything) == 3
    created = [(r["created_at"], r["action_id"]) for r in everything]
    assert created == sorted(created, reverse=True)
    assert listing(store) == everything
    page = dataoad("receipts", "list", "--json", "--limit", "2", cwd=store.cwd, env=store.env)
    assert page.returncode == 0, page.stderr
    assert json.loads(page.stdout) == everything[:2]
    assert "the newest 2 shown; more match" in page.stderr
    whole = dataoad("receipts", "list", "--limit", "3", cwd=store.cwd, env=store.env)
    assert whole.returncode == 0
    assert "more match" not in whole.stderr
    both = dataoad("receipts", "list", "--limit", "1", "--all", cwd=store.cwd, env=store.env)
    assert both.returncode == 2
    assert "not allowed with" in both.stderr


def test_list_shows_fifty_unless_told_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    charges(path, 51)
    shown = dataoad("receipts", "list", "--json", "--ledger", str(path), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    keys = [r["idempotency_key"] for r in json.loads(shown.stdout)]
    assert len(keys) == 50
    assert "k50" in keys  # the newest
    assert "k0" not in keys  # the oldest
    assert "the newest 50 shown; more match" in shown.stderr
    every = dataoad("receipts", "list", "--all", "--json", "--ledger", str(path), cwd=tmp_path)
    assert len(json.loads(every.stdout)) == 51
    assert "more match" not in every.stderr


def test_show_recover_and_release(store: Store) -> None:
    env, cwd = store.env, store.cwd
    unknown_id = str(listing(store, "--status", "UNKNOWN")[0]["action_id"])
    shown = dataoad("receipts", "show", unknown_id, cwd=cwd, env=env)
    assert shown.returncode == 0
    assert "final_status         UNKNOWN" in shown.stdout
    assert "#1 started" in shown.stdout
    refused = dataoad(
        "recover", unknown_id, "--verifier", "ops_verifier:Confirms", cwd=cwd, env=env
    )
    assert refused.returncode == 2, "recover without --yes and without a terminal must refuse"
    assert listing(store, "--status", "UNKNOWN"), "a refused recover changed something"
    done = dataoad(
        "recover", unknown_id, "--verifier", "ops_verifier:Confirms", "--yes", cwd=cwd, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "final_status         CONFIRMED" in done.stdout
    assert not listing(store, "--status", "UNKNOWN")
    stranded_id = str(listing(store, "--pending")[0]["action_id"])
    released = dataoad("release-unstarted", stranded_id, "--yes", cwd=cwd, env=env)
    assert released.returncode == 0, released.stderr
    assert not listing(store, "--pending")
    again = dataoad("release-unstarted", unknown_id, "--yes", cwd=cwd, env=env)
    assert again.returncode == 1
    assert "only a claim that never invoked" in again.stderr


def test_recover_with_a_verifier_that_raises_records_nothing_and_says_why(store: Store) -> None:
    env, cwd = store.env, store.cwd
    unknown_id = str(listing(store, "--status", "UNKNOWN")[0]["action_id"])
    before = dataoad("receipts", "show", unknown_id, "--json", cwd=cwd, env=env)
    for flags in ((), ("--json",)):
        done = dataoad(
            "recover",
            unknown_id,
            "--verifier",
            "ops_verifier:Down",
            "--yes",
            *flags,
            cwd=cwd,
            env=env,
        )
        assert done.returncode == 3, done.stderr  # still UNKNOWN
        assert "cus_42" in done.stdout  # the operator sees the message ...
        if flags:
            answer = json.loads(done.stdout)["verifier"]
            assert answer == {
                "counted_as": "UNKNOWN",
                "said": "ConnectionError: GET https://api.example/charges?customer=cus_42: refused",
                "recorded": False,
            }
        else:
            assert "nothing was recorded: the receipt is unchanged" in done.stdout
    after = dataoad("receipts", "show", unknown_id, "--json", cwd=cwd, env=env)
    shown_before, shown_after = json.loads(before.stdout), json.loads(after.stdout)
    audited = shown_after.pop("operator_records")
    assert shown_before.pop("operator_records") == []
    assert shown_after == shown_before  # ... the receipt does not keep it ...
    assert "cus_42" not in after.stdout  # ... nor does the audit, which says who tried
    assert [(r["verb"], r["outcome"]) for r in audited] == [("recover", "UNKNOWN")] * 2
    stranded_pending = dataoad(
        "recover", "--key", "order-3", "--verifier", "ops_verifier:Down", "--yes", cwd=cwd, env=env
    )
    assert stranded_pending.returncode == 1  # never started: release it instead
    assert "release-unstarted" in stranded_pending.stderr


def test_a_write_takes_an_id_prefix_of_exactly_eight_characters(store: Store) -> None:
    """Seven are refused (exit 2, nothing changed); eight, the documented least, are enough."""
    stranded = str(listing(store, "--pending")[0]["action_id"])
    seven = dataoad("release-unstarted", stranded[:7], "--yes", cwd=store.cwd, env=store.env)
    assert seven.returncode == 2
    assert listing(store, "--pending")
    eight = dataoad("release-unstarted", stranded[:8], "--yes", cwd=store.cwd, env=store.env)
    assert eight.returncode == 0, eight.stderr
    assert listing(store, "--pending") == []


def test_recover_by_key_with_json_and_writes_need_eight_characters_of_an_id(
    store: Store,
) -> None:
    env, cwd = store.env, store.cwd
    unknown_id = str(listing(store, "--status", "UNKNOWN")[0]["action_id"])
    for short in (unknown_id[:1], unknown_id[:7]):
        refused = dataoad(
            "recover", short, "--verifier", "ops_verifier:Confirms", "--yes", cwd=cwd, env=env
        )
        assert refused.returncode == 2, refused.stderr
        assert "at least 8 characters" in refused.stderr
        released = dataoad("release-unstarted", short, "--yes", cwd=cwd, env=env)
        assert released.returncode == 2
    assert listing(store, "--status", "UNKNOWN"), "a refused verb changed something"
    # Reading may still use any unique prefix.
    assert dataoad("receipts", "show", unknown_id[:1], cwd=cwd, env=env).returncode in (0, 1)
    done = dataoad(
        "recover",
        "--key",
        "order-1",
        "--action",
        "charge",
        "--verifier",
        "ops_verifier:Confirms",
        "--yes",
        "--json",
        cwd=cwd,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == "CONFIRMED"
    assert answer["verifier"]["counted_as"] == "CONFIRMED"
    assert answer["receipt"]["action_id"] == unknown_id
    both = dataoad(
        "recover",
        unknown_id,
        "--key",
        "order-1",
        "--verifier",
        "ops_verifier:Confirms",
        "--yes",
        cwd=cwd,
        env=env,
    )
    assert both.returncode == 2
    stranded = dataoad("release-unstarted", "--key", "order-3", "--yes", cwd=cwd, env=env)
    assert stranded.returncode == 0, stranded.stderr
    assert not listing(store, "--pending")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("receipts", "show", "no-such-id"), 1, "no action with id"),
        (("receipts", "list", "--ledger", "/nonexistent/ledger.sqlite3"), 1, "no ledger file"),
        (("receipts", "list", "--ledger", "postgresql://127.0.0.1:1/y"), 1, "cannot reach"),
        (("recover", "x", "--verifier", "missing_module:X", "--yes"), 1, "cannot import"),
        (("recover", "x", "--verifier", "no-colon", "--yes"), 2, "module:attribute"),
        (("receipts", "list", "--since", "yesterday"), 2, "ISO 8601"),
    ],
)
def test_problems_are_one_line_errors(
    store: Store, args: tuple[str, ...], code: int, message: str
) -> None:
    done = dataoad(*args, cwd=store.cwd, env=store.env)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_bad_table_name_is_a_one_line_error() -> None:
    table = PostgresTestTable()
    done = dataoad(
        "receipts", "list", "--ledger", table.dsn, "--table", "x.Bad-Name", cwd=ROOT, env={}
    )
    assert done.returncode == 1
    assert "SQL identifier" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_no_ledger_given_is_a_usage_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATAOAD_LEDGER"}
    done = subprocess.run(
        [sys.executable, "-m", "dataoad", "receipts", "list"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 2
    assert "DATAOAD_LEDGER" in done.stderr
    assert not list(tmp_path.iterdir()), "inspection created a file"


def test_ledger_migrate_on_postgres_from_several_processes_at_once() -> None:
    table = PostgresTestTable()
    command = [sys.executable, "-m", "dataoad", "ledger", "migrate", table.dsn]
    children = [
        subprocess.Popen(
            [*command, "--table", f"public.{table.table}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [child.communicate(timeout=120) for child in children]
    assert all(child.returncode == 0 for child in children), outputs
    lines = sorted(out.strip() for out, _ in outputs)
    assert (
        lines
        == [f"public.{table.table}: ledger schema 0 -> {PG_SCHEMA}"]
        + [f"public.{table.table}: ledger schema {PG_SCHEMA}, up to date"] * 3
    )

    async def usable() -> None:
        ledger = table.client()
        try:
            assert await ledger.schema_version() == PG_SCHEMA
            assert await ledger.receipts() == []
        finally:
            await ledger.close()
            await table.drop()

    asyncio.run(usable())


def test_ledger_migrate_creates_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    first = dataoad("ledger", "migrate", str(path), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"{path}: ledger schema 0 -> {SQLITE_SCHEMA}"
    second = dataoad("ledger", "migrate", f"sqlite:///{path}", cwd=tmp_path)
    assert second.stdout.strip() == f"{path}: ledger schema {SQLITE_SCHEMA}, up to date"
    assert (path.stat().st_mode & 0o777) == 0o600


# -- read-only inspection (SQLite) -------------------------------------------------


def sqlite_store_files(store: Store) -> list[str]:
    return sorted(p.name for p in store.cwd.iterdir() if p.name.startswith("ledger"))


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_inspection_writes_nothing_and_creates_no_file(store: Store) -> None:
    path = store.cwd / "ledger.sqlite3"
    (store.cwd / "ledger.sqlite3.lock").unlink(missing_ok=True)
    before, content = sqlite_store_files(store), path.read_bytes()
    any_id = str(listing(store)[0]["action_id"])
    shown = dataoad("receipts", "show", any_id[:8], cwd=store.cwd, env=store.env)
    assert shown.returncode == 0, shown.stderr
    assert sqlite_store_files(store) == before  # no -wal, -shm or .lock of ours
    assert path.read_bytes() == content


def test_an_empty_file_is_reported_and_left_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite3"
    empty.touch()
    done = dataoad("receipts", "list", "--ledger", str(empty), cwd=tmp_path)
    assert done.returncode == 1
    assert "is empty" in done.stderr
    assert empty.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.sqlite3"]


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_an_operator_with_read_only_access_can_inspect(store: Store) -> None:
    with read_only_copy(store.cwd / "ledger.sqlite3") as db:
        folder = db.parent
        done = as_nobody(["receipts", "list", "--ledger", str(db)], folder)
        assert done.returncode == 0, done.stderr
        assert "(3 receipts)" in done.stdout
        assert sorted(p.name for p in folder.iterdir()) == ["ledger.sqlite3"]
        os.chmod(db, 0o000)
        denied = as_nobody(["receipts", "list", "--ledger", str(db)], folder)
        assert denied.returncode == 1
        assert "no read permission" in denied.stderr
        assert "corrupt" not in denied.stderr


@pytest.mark.parametrize(
    ("ledger", "code", "message"),
    [
        ("mysql://u@h/db", 2, "unsupported ledger URL scheme 'mysql'"),
        (".", 1, "is a folder, not a ledger file"),
    ],
)
def test_unknown_schemes_and_folders_are_named(
    tmp_path: Path, ledger: str, code: int, message: str
) -> None:
    for command in (("receipts", "list"), ("release-unstarted", "ab12", "--yes")):
        done = dataoad(*command, "--ledger", ledger, cwd=tmp_path)
        assert done.returncode == code, done.stderr
        assert message in done.stderr
        assert "postgresql://" in done.stderr or code == 1
        assert len(done.stderr.strip().splitlines()) == 1


# -- the CLI details ---------------------------------------------------------------


def test_show_finds_a_receipt_by_prefix_or_by_key(store: Store) -> None:
    env, cwd = store.env, store.cwd
    rows = listing(store)
    first = str(rows[0]["action_id"])
    for given in (first, first[:6], first[:6].upper()):
        shown = dataoad("receipts", "show", given, "--json", cwd=cwd, env=env)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["action_id"] == first
    by_key = dataoad("receipts", "show", "--key", "order-3", "--json", cwd=cwd, env=env)
    assert json.loads(by_key.stdout)["action_name"] == "refund"
    missing = dataoad("receipts", "show", "--key", "order-9", cwd=cwd, env=env)
    assert missing.returncode == 1
    assert "no receipt with key 'order-9'" in missing.stderr
    unknown_prefix = "0" * 31 if not first.startswith("0" * 31) else "f" * 31
    nothing = dataoad("receipts", "show", unknown_prefix, cwd=cwd, env=env)
    assert nothing.returncode == 1
    assert "no action with id" in nothing.stderr


def test_an_ambiguous_prefix_or_key_asks_for_more(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    charges(path, 20, also=("refund", "k0"))  # 20 ids over 16 first digits: two share one
    env = {"DATAOAD_LEDGER": str(path)}
    ids = [
        str(r["action_id"])
        for r in json.loads(dataoad("receipts", "list", "--json", cwd=tmp_path, env=env).stdout)
    ]
    firsts = [i[0] for i in ids]
    shared = next(c for c in firsts if firsts.count(c) > 1)
    done = dataoad("receipts", "show", shared, cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert "matches several actions" in done.stderr
    both = dataoad("receipts", "show", "--key", "k0", cwd=tmp_path, env=env)
    assert both.returncode == 1
    assert "used by several actions (charge, refund); add --action" in both.stderr
    one = dataoad(
        "receipts", "show", "--key", "k0", "--action", "refund", "--json", cwd=tmp_path, env=env
    )
    assert json.loads(one.stdout)["action_name"] == "refund"


def test_times_have_a_zone_and_statuses_any_case(store: Store) -> None:
    table = dataoad("receipts", "list", cwd=store.cwd, env=store.env)
    header, first_row = table.stdout.splitlines()[:2]
    assert header.split()[-2:] == ["CREATED", "UPDATED"]
    assert first_row.endswith("Z")
    for spelled in ("unknown", "Unknown", "UNKNOWN"):
        assert [r["idempotency_key"] for r in listing(store, "--status", spelled)] == ["order-1"]


@pytest.mark.parametrize(
    "args",
    [("--status", "maybe"), ("--limit", "-1"), ("--limit", "0"), ("--limit", "many")],
)
def test_bad_filters_are_usage_errors(store: Store, args: tuple[str, ...]) -> None:
    done = dataoad("receipts", "list", *args, cwd=store.cwd, env=store.env)
    assert done.returncode == 2
    assert args[1] in done.stderr


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_table_is_refused_for_a_sqlite_ledger(store: Store) -> None:
    done = dataoad("receipts", "list", "--table", "public.x", cwd=store.cwd, env=store.env)
    assert done.returncode == 2
    assert "--table applies to PostgreSQL ledgers only" in done.stderr


def test_ledger_migrate_reads_dataoad_ledger(tmp_path: Path) -> None:
    path = tmp_path / "from-env.sqlite3"
    done = dataoad("ledger", "migrate", cwd=tmp_path, env={"DATAOAD_LEDGER": str(path)})
    assert done.returncode == 0, done.stderr
    assert path.is_file()


def test_a_closed_pipe_ends_the_listing_quietly(store: Store) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "dataoad", "receipts", "list", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=store.cwd,
        env={**os.environ, **store.env},
    )
    assert child.stdout is not None
    assert child.stderr is not None
    child.stdout.close()  # the reader is gone before anything is written
    with child.stderr:
        errors = child.stderr.read().decode()
    assert child.wait(timeout=60) in (0, 141)
    assert errors == ""


def test_recover_guides_the_operator(store: Store) -> None:
    env, cwd = store.env, store.cwd
    (cwd / "inconclusive.py").write_text(
        "from dataoad import VerificationResult\n"
        "def verifier(receipt):\n"
        "    return VerificationResult.unknown(reason='provider search index is rebuilding')\n"
    )
    [before] = listing(store, "--pending")
    stranded = str(before["action_id"])
    hint = dataoad(
        "recover", stranded, "--verifier", "inconclusive:verifier", "--yes", cwd=cwd, env=env
    )
    assert hint.returncode == 1
    assert f"dataoad release-unstarted {stranded}" in hint.stderr
    # Refused means untouched: still PENDING, same version, nothing recorded.
    [still_pending] = listing(store, "--pending")
    assert still_pending["action_id"] == stranded
    assert still_pending["version"] == before["version"]
    assert still_pending["claim_state"] == "PENDING"
    unknown_id = str(listing(store, "--status", "unknown")[0]["action_id"])
    still = dataoad(
        "recover", unknown_id, "--verifier", "inconclusive:verifier", "--yes", cwd=cwd, env=env
    )
    assert still.returncode == 3, still.stderr
    assert "provider search index is rebuilding" in still.stdout
    assert "Still UNKNOWN" in still.stderr


def _key_with_history(path: Path, reopened: int, *, hold: bool = True) -> str:
    """A key reopened ``reopened`` times (each a FAILED receipt), then held UNKNOWN."""
    from dataoad import ActionRunner, DefinitiveFailure, SQLiteLedger

    async def fill() -> str:
        async with SQLiteLedger(path) as ledger:
            runner = ActionRunner(ledger)

            def declined() -> None:
                raise DefinitiveFailure("card declined")

            for _ in range(reopened):
                failed = await runner.execute(
                    "charge", declined, request={}, idempotency_key="order-1"
                )
                await runner.reopen(failed.receipt.action_id)
            if not hold:
                return ""

            def lost() -> None:
                raise TimeoutError("no answer")

            held = await runner.execute("charge", lost, request={}, idempotency_key="order-1")
            assert held.receipt.final_status is not None
            assert held.receipt.final_status.value == "UNKNOWN"
            return held.receipt.action_id

    return asyncio.run(fill())


def test_key_names_its_holder_past_a_long_history(tmp_path: Path) -> None:
    # More reopened receipts under the key than one page of the old listing
    # (50): the holder is the newest, never an old receipt that gave it up.
    path = tmp_path / "ledger.sqlite3"
    holder = _key_with_history(path, 55)
    env = {"DATAOAD_LEDGER": str(path)}
    shown = dataoad("receipts", "show", "--key", "order-1", "--json", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    assert (json.loads(shown.stdout)["action_id"], json.loads(shown.stdout)["final_status"]) == (
        holder,
        "UNKNOWN",
    )


async def test_a_key_whose_history_fills_the_listing_needs_its_action_and_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from argparse import Namespace

    from dataoad import SQLiteLedger, _cli_ledger
    from dataoad._cli_common import CommandError

    path = tmp_path / "ledger.sqlite3"
    holder = await asyncio.to_thread(_key_with_history, path, 4)
    monkeypatch.setattr(_cli_ledger, "_KEY_HISTORY", 3)  # 5 receipts: the listing is cut short

    def asked(action: str | None, namespace: str | None) -> Namespace:
        return Namespace(
            key="order-1", action=action, namespace=namespace, action_id=None, command="receipts"
        )

    async with SQLiteLedger(path) as ledger:
        for action, namespace in ((None, None), ("charge", None), (None, "")):
            with pytest.raises(CommandError, match="has more than 2 receipts; add --action"):
                await _cli_ledger._find_one(ledger, asked(action, namespace))
        found = await _cli_ledger._find_one(ledger, asked("charge", ""))
        assert found.action_id == holder
        await ledger.close()
    # A key no receipt holds any more: its newest receipt is the one named.
    freed = tmp_path / "freed.sqlite3"
    await asyncio.to_thread(_key_with_history, freed, 5, hold=False)
    async with SQLiteLedger(freed) as ledger:
        newest = (await ledger.receipts(newest_first=True, limit=1))[0]
        assert (await _cli_ledger._find_one(ledger, asked("charge", ""))).action_id == (
            newest.action_id
        )


def test_ctrl_c_ends_a_command_with_one_line_and_status_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from argparse import Namespace

    from dataoad import _cli_ledger

    async def interrupted(args: Namespace) -> int:
        raise KeyboardInterrupt  # what asyncio.run raises after cancelling the command

    monkeypatch.setattr(_cli_ledger, "_run", interrupted)
    assert _cli_ledger.run_ledger_command(Namespace(command="receipts")) == 130
    assert capsys.readouterr().err == "dataoad receipts: interrupted\n"


def test_stored_strings_cannot_drive_the_terminal(tmp_path: Path) -> None:
    # A key and a provider's error message that would retitle the terminal,
    # move the cursor up over the status line and rewrite it.
    from dataoad import ActionRunner, SQLiteLedger

    path = tmp_path / "ledger.sqlite3"
    key = "order-7\x1b]0;pwned\x07"
    forged = "gateway timeout\x1b[5A\r\x1b[2K  final_status         CONFIRMED\nforged line"

    async def fill() -> None:
        async with SQLiteLedger(path) as ledger:

            def lost() -> None:
                raise TimeoutError(forged)

            await ActionRunner(ledger).execute("charge", lost, request={}, idempotency_key=key)

    asyncio.run(fill())
    env = {"DATAOAD_LEDGER": str(path)}
    shown = dataoad("receipts", "show", "--key", key, cwd=tmp_path, env=env)
    listed = dataoad("receipts", "list", cwd=tmp_path, env=env)
    for done in (shown, listed):
        assert done.returncode == 0, done.stderr
        assert not any(c in done.stdout for c in "\x1b\x07\r")
        assert "order-7\\x1b]0;pwned\\x07" in done.stdout
    assert "\\x1b[5A\\x0d\\x1b[2K  final_status         CONFIRMED\\x0aforged line" in shown.stdout
    assert not any(line.startswith("forged line") for line in shown.stdout.splitlines())
    statuses = [line.split()[1] for line in shown.stdout.splitlines() if "final_status" in line]
    assert statuses[0] == "UNKNOWN"


def test_recover_of_a_settled_receipt_says_it_asked_no_verifier(store: Store) -> None:
    recover = ("recover", "--key", "order-1", "--yes", "--verifier")
    first = dataoad(*recover, "ops_verifier:Confirms", cwd=store.cwd, env=store.env)
    assert first.returncode == 0, first.stderr
    assert "Verifier: counted as CONFIRMED" in first.stdout
    again = dataoad(*recover, "ops_verifier:Down", "--json", cwd=store.cwd, env=store.env)
    assert again.returncode == 0, again.stderr
    said = json.loads(again.stdout)
    assert (said["status"], said["verifier"]) == ("CONFIRMED", None)
    audit = dataoad("audit", "--json", cwd=store.cwd, env=store.env)
    outcomes = [r["outcome"] for r in json.loads(audit.stdout)]
    assert outcomes == ["already CONFIRMED: nothing changed", "CONFIRMED"]
