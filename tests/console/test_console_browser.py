"""The console as a team uses it: ``dataoad serve`` in its own process, driven by Debian's
chromium through Playwright, on SQLite and PostgreSQL; and a read-only console run by a
user who may read the ledger file but not write it.

Screenshots of the queue, a receipt page and an action's result are kept in
``test-artifacts/`` (or ``$DATAOAD_ARTIFACTS``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from suite_support.console import HOSTILE, ConsoleStore, console_store
from suite_support.services import unavailable

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-test-token-0123456789"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_until_serving(process: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(
                f"the console exited: {process.stderr.read() if process.stderr else ''}"
            )
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("the console did not start within 30 s")


@contextmanager
def serving(argv: list[str], cwd: Path, env: dict[str, str]) -> Iterator[str]:
    """A running console; its base URL."""
    port = _free_port()
    process = subprocess.Popen(
        [*argv, "--port", str(port)],
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until_serving(process, port)
        yield f"http://127.0.0.1:{port}"
    except BaseException as failure:
        process.terminate()
        said = process.communicate(timeout=10)[1]
        failure.add_note(f"the console said: {said[-3000:]}")
        raise
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
        if process.stderr is not None:
            process.stderr.close()


def _artifacts() -> Path:
    folder = Path(os.environ.get("DATAOAD_ARTIFACTS", ROOT / "test-artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ConsoleStore]:
    with console_store(request.param, tmp_path) as found:
        yield found


def test_a_team_member_logs_in_finds_the_receipt_and_verifies_it(store: ConsoleStore) -> None:
    if not Path(CHROMIUM).exists():
        unavailable("Debian's chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (the dev extra)")
    kind = "sqlite" if store.table is None else "postgres"
    shots = _artifacts()
    argv = [sys.executable, "-m", "dataoad", "serve", *store.args(), "--allow-actions"]
    argv += ["--verifiers", "ops_verifiers:VERIFIERS"]
    with (
        serving(argv, store.folder, {"DATAOAD_CONSOLE_TOKEN": TOKEN}) as base,
        sync_playwright() as driver,
    ):
        browser = driver.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            tab = browser.new_page(viewport={"width": 1300, "height": 800})
            requests: list[str] = []
            tab.on("request", lambda r: requests.append(r.url))
            tab.goto(base + "/")
            assert tab.url == base + "/login"  # nothing before logging in
            tab.fill("input[name=token]", TOKEN)
            tab.click("button[type=submit]")
            tab.wait_for_url(base + "/")
            rows = tab.locator("table.queue tbody tr")
            assert rows.count() == 2
            assert tab.locator("table.counts tbody tr").count() == 1
            # The hostile key is shown as text, and no script ever runs.
            assert HOSTILE[:28] in tab.locator("table.queue").inner_text()
            assert tab.evaluate("document.scripts.length") == 0
            tab.screenshot(path=str(shots / f"console-queue-{kind}.png"), full_page=True)
            tab.click(f"a[href='/receipts/{store.unknown_id}']")
            tab.wait_for_url(f"{base}/receipts/{store.unknown_id}")
            timeline = tab.locator("ol.timeline li").all_inner_texts()
            assert any("verifier (execute) counted as UNKNOWN" in t for t in timeline)
            assert tab.evaluate("document.scripts.length") == 0
            tab.screenshot(path=str(shots / f"console-receipt-{kind}.png"), full_page=True)
            verify = tab.locator("form.action").filter(has=tab.locator("button[value=verify]"))
            verify.locator("input[name=operator]").fill("ana")
            verify.locator("input[name=reason]").fill("INC-77: the provider's dashboard shows it")
            verify.locator("button[value=verify]").click()
            tab.wait_for_selector("p.message")
            assert "verified: now CONFIRMED" in tab.locator("p.message").inner_text()
            tab.screenshot(path=str(shots / f"console-action-{kind}.png"), full_page=True)
            tab.click("text=Back to the receipt")
            assert "CONFIRMED" in tab.locator("td.status").inner_text()
            assert "operator recover by ana@" in tab.locator("ol.timeline").inner_text()
            tab.goto(base + "/audit")
            assert "INC-77" in tab.locator("table.audit").inner_text()
            # The same record that dataoad receipts show prints.
            shown = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dataoad",
                    "receipts",
                    "show",
                    store.unknown_id,
                    *store.args(),
                ],
                capture_output=True,
                text=True,
                cwd=store.folder,
                check=True,
            )
            assert "ana@" in shown.stdout
            assert f"recover {store.unknown_id}: CONFIRMED" in shown.stdout
            assert 'reason="INC-77' in shown.stdout
        finally:
            browser.close()
    assert all(url.startswith(base) for url in requests), "a page fetched something elsewhere"
    for name in ("queue", "receipt", "action"):
        assert (shots / f"console-{name}-{kind}.png").stat().st_size > 10_000


def test_serve_refuses_to_start_where_it_would_expose_the_ledger(tmp_path: Path) -> None:
    (tmp_path / "l.sqlite3").touch()
    cases = [
        (["--host", "0.0.0.0"], {}, "not a loopback address"),
        (["--host", "0.0.0.0", "--allow-remote"], {}, "needs a token"),
        (["--allow-actions"], {}, "needs a token"),
        (["--allow-actions"], {"DATAOAD_CONSOLE_TOKEN": "short"}, "at least 16"),
        (["--port", "70000"], {}, "between 1 and 65535"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "DATAOAD_CONSOLE_TOKEN"}
    for flags, extra, says in cases:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dataoad",
                "serve",
                "--ledger",
                str(tmp_path / "l.sqlite3"),
                *flags,
            ],
            capture_output=True,
            text=True,
            env={**env, **extra},
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (flags, done.stderr)
        assert says in done.stderr
        assert done.stderr.count("\n") == 1


_AS_NOBODY = """
import os, sys
import dataoad._cli, dataoad._cli_ledger, dataoad._cli_serve, dataoad.ledgers.sqlite_reader
import dataoad._console.app, dataoad._console.data, dataoad._console.actions
import uvicorn, uvicorn.main, uvicorn.config, uvicorn.server, uvicorn.lifespan.on
import uvicorn.loops.asyncio, uvicorn.protocols.http.h11_impl, uvicorn.logging
import h11, jinja2, starlette.staticfiles, starlette.templating, sqlite3, json, asyncio
import concurrent.futures.thread, email.utils, mimetypes, anyio._backends._asyncio
import encodings.unicode_escape, encodings.idna, encodings.latin_1, encodings.ascii
if os.geteuid() == 0:  # import first: the interpreter's own files are under /root
    os.setgid(65534); os.setuid(65534)
sys.exit(dataoad._cli.main(sys.argv[1:]))
"""


def test_a_read_only_console_works_for_a_user_who_cannot_write_the_file(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        unavailable("needs root to run the console as another user")
    with console_store("sqlite", tmp_path) as store:
        folder = Path(f"/tmp/dataoad-console-{os.getpid()}")
        folder.mkdir(mode=0o755, exist_ok=True)
        os.chmod(folder, 0o755)
        db = folder / "ledger.sqlite3"
        shutil.copy(Path(store.url.removeprefix("sqlite:///")), db)
        os.chmod(db, 0o444)
        before = db.read_bytes()
        try:
            argv = [sys.executable, "-c", _AS_NOBODY, "serve", "--ledger", str(db)]
            argv += ["--host", "127.0.0.1"]
            with serving(argv, folder, {}) as base:
                with urllib.request.urlopen(base + "/", timeout=30) as answer:
                    page = answer.read().decode()
                with urllib.request.urlopen(
                    f"{base}/api/receipts/{store.unknown_id}", timeout=30
                ) as answer:
                    assert answer.status == 200
            assert store.unknown_id in page
            assert db.read_bytes() == before
            assert sorted(p.name for p in folder.iterdir()) == ["ledger.sqlite3"]
        finally:
            for path in folder.iterdir():
                path.unlink()
            folder.rmdir()
