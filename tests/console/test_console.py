"""The operator console over HTTP, in process (Starlette's test client), on SQLite and PostgreSQL.

The queue, a receipt page with its timeline, the audit and their JSON twins;
what a read-only console refuses; the token, the session cookie and CSRF;
the headers every response carries; and every hostile stored string shown
as text. The browser tests (Playwright driving Debian's chromium) are in
``test_console_browser.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from suite_support.services import unavailable

try:
    from starlette.testclient import TestClient
except ImportError:  # the dev extra brings the console extra's packages
    unavailable("starlette is not installed (the console extra)", module_level=True)

from dataoad._cli_serve import console_settings
from dataoad._console.app import build_app
from dataoad._console.security import check_bind, is_loopback
from dataoad.ledgers.sqlite_reader import SQLiteReader
from suite_support.console import (
    HOSTILE,
    ConsoleStore,
    add_started_claim,
    add_tenant_failure,
    console_store,
)

TOKEN = "a-token-of-at-least-16-characters"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ConsoleStore]:
    with console_store(request.param, tmp_path) as found:
        yield found


def serve_args(s: ConsoleStore, **flags: Any) -> argparse.Namespace:
    return argparse.Namespace(
        ledger=s.url,
        table=s.table,
        host=flags.get("host", "127.0.0.1"),
        port=8765,
        verifiers=flags.get("verifiers"),
        allow_actions=flags.get("allow_actions", False),
        allow_remote=flags.get("allow_remote", False),
    )


def client(
    s: ConsoleStore, monkeypatch: pytest.MonkeyPatch, token: str | None = None, **flags: Any
) -> TestClient:
    monkeypatch.chdir(s.folder)  # where --verifiers modules are found
    settings = console_settings(serve_args(s, **flags), token)
    return TestClient(build_app(settings), base_url="http://127.0.0.1")


def test_the_queue_lists_unknown_and_stale_claims_with_counts(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client(store, monkeypatch) as http:
        page = http.get("/")
        assert page.status_code == 200
        queue = http.get("/api/queue").json()
    kinds = {row["action_id"]: row["kind"] for row in queue["rows"]}
    assert kinds == {store.unknown_id: "UNKNOWN", store.stale_id: "stale PENDING"}
    assert queue["counts"] == {"": {"UNKNOWN": 1, "stale PENDING": 1}}
    created = [row["created_at"] for row in queue["rows"]]
    assert created == sorted(created, reverse=True)  # newest first
    assert all(row["age_seconds"] >= 0 for row in queue["rows"])
    assert store.failed_id not in page.text  # settled: not in the queue
    assert f"/receipts/{store.unknown_id}" in page.text
    assert_escaped(page.text)


def assert_escaped(html: str) -> None:
    """No stored string came through as markup, and control characters are visible."""
    assert "<script" not in html
    assert "&lt;script&gt;" in html
    assert "\x07" not in html
    assert "\x1b" not in html
    assert "\\x07" in html


def test_a_receipt_page_shows_its_whole_timeline_and_its_json(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client(store, monkeypatch) as http:
        page = http.get(f"/receipts/{store.unknown_id}")
        data = http.get(f"/api/receipts/{store.unknown_id}").json()
        missing = http.get("/receipts/" + "0" * 32)
        bad = http.get("/api/receipts/not-an-id")
    assert page.status_code == 200
    whats = [event["what"] for event in data["timeline"]]
    assert whats[0] == "claimed"
    assert "attempt 1 started" in whats
    assert "attempt 1 finished" in whats
    assert "verifier (execute) counted as UNKNOWN" in whats
    assert data["receipt"]["idempotency_key"] == f"key {HOSTILE}"
    assert data["receipt"]["metadata"]["note"] == HOSTILE
    assert_escaped(page.text)
    assert "provider says" in page.text
    assert missing.status_code == 404
    assert bad.status_code == 404


def test_a_read_only_console_refuses_every_action_and_never_writes(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = receipts_of(store)
    with client(store, monkeypatch) as http:
        for action in ("verify", "reopen", "release"):
            done = http.post(f"/receipts/{store.unknown_id}/{action}", data={"csrf": "x"})
            assert done.status_code == 403
            assert "read-only" in done.text
        assert "Act" not in http.get(f"/receipts/{store.unknown_id}").text
    assert receipts_of(store) == before


def receipts_of(s: ConsoleStore) -> Any:
    if s.table is not None:
        return None  # PostgreSQL: the audit test below checks nothing was recorded
    path = Path(s.url.removeprefix("sqlite:///"))

    async def read() -> Any:
        reader = SQLiteReader(path)
        try:
            return await reader.receipts(), await reader.audit()
        finally:
            await reader.close()

    return asyncio.run(read()), path.stat().st_mtime_ns


def test_with_a_token_nothing_is_shown_before_logging_in(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client(store, monkeypatch, TOKEN) as http:
        for path in ("/", "/audit", f"/receipts/{store.unknown_id}"):
            answer = http.get(path, follow_redirects=False)
            assert answer.status_code == 303
            assert answer.headers["location"] == "/login"
        assert http.get("/api/queue").status_code == 401
        bearer = {"authorization": f"Bearer {TOKEN}"}
        assert http.get("/api/queue", headers=bearer).status_code == 200
        assert (
            http.get("/api/queue", headers={"authorization": f"Bearer {TOKEN}x"}).status_code == 401
        )
        wrong = http.post("/login", data={"token": TOKEN[:-1]}, follow_redirects=False)
        assert wrong.status_code == 401
        assert "dataoad_console" not in wrong.headers.get("set-cookie", "")
        right = http.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert right.status_code == 303
        cookie = right.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
        assert http.get("/").status_code == 200
        # Logging out needs the page's CSRF token too: absent, empty or wrong, it is refused.
        csrf = re.search(r'name="csrf" value="([^"]+)"', http.get("/").text)
        assert csrf is not None
        for form in ({}, {"csrf": ""}, {"csrf": csrf.group(1)[:-1] + "x"}):
            assert http.post("/logout", data=form, follow_redirects=False).status_code == 403
            assert http.get("/", follow_redirects=False).status_code == 200  # still logged in
        out = http.post("/logout", data={"csrf": csrf.group(1)}, follow_redirects=False)
        assert out.status_code == 303
        assert http.get("/", follow_redirects=False).headers["location"] == "/login"


def test_an_action_needs_the_token_and_the_csrf_token_and_is_audited(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client(
        store, monkeypatch, TOKEN, allow_actions=True, verifiers="ops_verifiers:VERIFIERS"
    ) as http:
        form = {"operator": "ana", "reason": f"INC-9 {HOSTILE}", "csrf": ""}
        target = f"/receipts/{store.unknown_id}/verify"
        assert http.post(target, data=form).status_code == 403  # not logged in
        http.post("/login", data={"token": TOKEN})
        page = http.get(f"/receipts/{store.unknown_id}")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None
        assert http.post(target, data=form).status_code == 403  # an empty CSRF token
        absent = {k: v for k, v in form.items() if k != "csrf"}
        assert http.post(target, data=absent).status_code == 403  # no CSRF field at all
        wrong = {**form, "csrf": csrf.group(1)[:-1] + "x"}
        assert http.post(target, data=wrong).status_code == 403
        no_reason = {**form, "csrf": csrf.group(1), "reason": " "}
        assert http.post(target, data=no_reason).status_code == 409
        assert http.get("/api/audit").json()["records"] == []  # nothing done yet
        done = http.post(target, data={**form, "csrf": csrf.group(1)})
        assert done.status_code == 200, done.text
        assert "verified: now CONFIRMED" in done.text
        data = http.get(f"/api/receipts/{store.unknown_id}").json()
        assert data["receipt"]["final_status"] == "CONFIRMED"
        (record,) = data["operator_records"]
        assert (record["operator"], record["verb"], record["outcome"]) == (
            "ana",
            "recover",
            "CONFIRMED",
        )
        assert record["reason"] == f"INC-9 {HOSTILE}"
        audit = http.get("/audit")
        assert_escaped(audit.text)
        # A refused action is refused by the runner, and recorded as refused.
        again = http.post(
            f"/receipts/{store.unknown_id}/release", data={**form, "csrf": csrf.group(1)}
        )
        assert again.status_code == 409
        outcomes = [r["outcome"] for r in http.get("/api/audit").json()["records"]]
        assert outcomes[0].startswith("refused: ")
        assert outcomes[1:] == ["CONFIRMED"]


def test_an_action_on_another_namespaces_receipt_runs_in_that_namespace(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A console action runs where the CLI's verb would: in the receipt's own namespace.
    Reopening tenant's FAILED charge frees tenant's key, leaves the default namespace's
    receipt under the same key untouched, and is audited in tenant."""
    tenant_id = add_tenant_failure(store)
    with client(store, monkeypatch, TOKEN, allow_actions=True) as http:
        http.post("/login", data={"token": TOKEN})
        page = http.get(f"/receipts/{tenant_id}")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None
        form = {"operator": "ana", "reason": "INC-10", "csrf": csrf.group(1)}
        done = http.post(f"/receipts/{tenant_id}/reopen", data=form)
        assert done.status_code == 200, done.text
        assert "reopened" in done.text
        data = http.get(f"/api/receipts/{tenant_id}").json()
        assert data["receipt"]["namespace"] == "tenant"
        assert data["receipt"]["retired_at"] is not None
        (record,) = data["operator_records"]
        assert (record["operator"], record["verb"], record["namespace"]) == (
            "ana",
            "reopen",
            "tenant",
        )
        untouched = http.get(f"/api/receipts/{store.failed_id}").json()
        assert untouched["receipt"]["namespace"] == ""
        assert untouched["receipt"]["retired_at"] is None
        assert untouched["operator_records"] == []


def test_a_claim_whose_worker_still_holds_its_lease_is_not_verified_from_here(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verifying a started claim settles it: under a worker that still renews its lease
    (by the ledger's clock) that worker could commit after the verifier looked. Once the
    lease has run out the same action settles it."""
    live = add_started_claim(store, "in-flight", lease=600)
    # Long enough for the worker to prove its lease before its call (a third
    # of it, against a ledger round trip), short enough to run out below.
    gone = add_started_claim(store, "dead-worker", lease=0.6)
    time.sleep(0.65)  # its lease has run out
    with client(
        store, monkeypatch, TOKEN, allow_actions=True, verifiers="ops_verifiers:VERIFIERS"
    ) as http:
        http.post("/login", data={"token": TOKEN})
        page = http.get(f"/receipts/{live}")
        assert "still renews this claim" in page.text
        assert f"/receipts/{live}/verify" not in page.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', http.get(f"/receipts/{gone}").text)
        assert csrf is not None
        form = {"operator": "ana", "reason": "INC-11", "csrf": csrf.group(1)}
        refused = http.post(f"/receipts/{live}/verify", data=form)
        assert refused.status_code == 409
        assert "still holds the claim" in refused.text
        held = http.get(f"/api/receipts/{live}").json()
        assert (held["receipt"]["claim_state"], held["receipt"]["final_status"]) == (
            "PENDING",
            None,
        )
        assert held["operator_records"] == []
        assert f"/receipts/{gone}/verify" in http.get(f"/receipts/{gone}").text
        done = http.post(f"/receipts/{gone}/verify", data=form)
        assert done.status_code == 200, done.text
        assert "verified: now CONFIRMED" in done.text


def test_odd_query_parameters_are_answered_never_an_internal_error(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client(store, monkeypatch) as http:
        for path in ("/?page=\u00b2", "/api/queue?page=\u00b9", "/audit?page=\u0663"):
            assert http.get(path).status_code == 200, path  # not a page number: page 1
        # Page 2000 of the audit asks for more records than one listing holds.
        for path in ("/audit?page=1999", "/audit?page=2000", "/api/audit?page=100000"):
            answer = http.get(path)
            assert answer.status_code == 200, path
        assert http.get("/api/audit?page=2000").json()["records"] == []
        for operator in ("a%00b", "x" * 1001):
            for path in (f"/audit?operator={operator}", f"/api/audit?operator={operator}"):
                answer = http.get(path)
                assert answer.status_code == 400, path
                assert "operator" in answer.text
        assert http.get("/api/audit?operator=" + "x" * 1000).status_code == 200


def test_an_internal_error_still_carries_the_security_headers(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataoad._console import app as console_app

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the console")

    monkeypatch.setattr(console_app, "queue", broken)
    monkeypatch.chdir(store.folder)
    settings = console_settings(serve_args(store), None)
    with TestClient(build_app(settings), raise_server_exceptions=False) as http:
        answer = http.get("http://127.0.0.1/")
    assert answer.status_code == 500
    assert answer.text == "internal error"
    assert "default-src 'none'" in answer.headers["content-security-policy"]
    assert answer.headers["x-frame-options"] == "DENY"


def test_a_verifiers_class_that_cannot_be_made_is_one_line_not_a_traceback(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataoad._cli_common import UsageError

    (store.folder / "needs_args.py").write_text(
        "class Keyed:\n    def __init__(self, api_key):\n        self.api_key = api_key\n"
    )
    monkeypatch.chdir(store.folder)
    with pytest.raises(UsageError) as refused:
        console_settings(serve_args(store, verifiers="needs_args:Keyed"), None)
    said = str(refused.value)
    assert said.startswith("--verifiers needs_args:Keyed: a class is made with no arguments")
    assert "TypeError" in said
    assert "\n" not in said


def test_every_response_forbids_scripts_and_foreign_assets(
    store: ConsoleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client(store, monkeypatch) as http:
        for path in ("/", "/audit", f"/receipts/{store.unknown_id}", "/api/queue", "/nowhere"):
            answer = http.get(path)
            policy = answer.headers["content-security-policy"]
            assert "default-src 'none'" in policy
            assert "script-src" not in policy  # none allowed at all
            assert answer.headers["x-frame-options"] == "DENY"
            assert answer.headers["x-content-type-options"] == "nosniff"
        # Another Host (DNS rebinding) is refused on a loopback console.
        assert http.get("/", headers={"host": "attacker.example"}).status_code == 400


@pytest.mark.parametrize(
    ("host", "remote", "token", "actions", "refused"),
    [
        ("127.0.0.1", False, None, False, None),
        ("::1", False, None, False, None),
        ("localhost", False, None, False, None),
        ("0.0.0.0", False, TOKEN, False, "not a loopback"),
        ("192.0.2.7", True, None, False, "needs a token"),
        ("192.0.2.7", True, TOKEN, True, None),
        ("127.0.0.1", False, None, True, "needs a token"),
        ("127.0.0.1", False, "short-token", False, "at least 16"),
        ("127.0.0.1", False, "x" * 16, True, None),
    ],
)
def test_the_bind_rules(
    host: str, remote: bool, token: str | None, actions: bool, refused: str | None
) -> None:
    if refused is None:
        check_bind(host, allow_remote=remote, token=token, allow_actions=actions)
    else:
        with pytest.raises(ValueError, match=refused):
            check_bind(host, allow_remote=remote, token=token, allow_actions=actions)
    assert is_loopback("127.8.9.10")
    assert not is_loopback("example.com")


async def test_the_queue_ages_receipts_by_the_ledger_clock_not_this_hosts() -> None:
    """console.md: ages are the ledger's clock's; a host whose clock is off shows them right."""
    from datetime import UTC, datetime

    from dataoad import ActionRunner, InMemoryLedger
    from dataoad._console.data import queue
    from dataoad.testing import ManualClock

    clock = ManualClock(datetime(2020, 1, 1, tzinfo=UTC))  # years behind this host
    ledger = InMemoryLedger(clock=clock)

    async def lost() -> None:
        raise TimeoutError("response lost")

    await ActionRunner(ledger).execute("charge", lost, request={}, idempotency_key="k")
    clock.advance(90)
    (row,) = (await queue(ledger, namespace=None, page=1)).rows
    assert row["kind"] == "UNKNOWN"
    assert row["age_seconds"] == 90
