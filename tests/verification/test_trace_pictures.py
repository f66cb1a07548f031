"""Counterexamples as pictures: `dataoad check --html` and the state machines' HTML traces.

The page is checked as text (every step drawn once, nothing fetched from
anywhere, text escaped) and in a real headless browser (Debian's chromium,
driven by Playwright), which must lay out every step; its screenshot is kept
in ``test-artifacts/`` (or ``$DATAOAD_ARTIFACTS``).
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dataoad.testing._trace_html import (
    render_html,
    steps_from_adapter,
    steps_from_history,
)
from suite_support.services import unavailable

# Slow: a Hypothesis search per adapter, and a browser.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHECK = ["examples/adapters/bug_wrong_reference.py", "--seed", "1"]


def _check(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    page, trace = tmp_path / "trace.html", tmp_path / "trace.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "dataoad", "check", *CHECK),
            *("--html", str(page), "--trace-json", str(trace), *extra),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    return done, page, trace


def _self_contained(page: str) -> None:
    assert not re.search(r"https?://", page), "the page refers to the network"
    assert not re.search(r"\b(src|href)\s*=", page), "the page loads an asset"
    assert "<script" not in page.lower()
    assert "@import" not in page


def test_check_draws_every_step_of_its_counterexample(tmp_path: Path) -> None:
    done, page, trace = _check(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    steps = json.loads(trace.read_text())["violation"]["steps"]
    html = page.read_text()
    _self_contained(html)
    drawn = re.findall(r'data-step="(\d+)"', html)
    assert drawn == [str(s["number"]) for s in steps]
    assert "Broken: verifier-names-the-receipts-reference" in html
    for lane in ("provider", "verifier", "ledger"):
        assert f">{lane}</tspan></text>" in html
    # The broken property's own step is drawn as a fault.
    assert re.search(rf'class="step fault" data-step="{len(steps)}"', html)
    # Nothing the trace says is cut: each step's words are all in the picture (wrapped).
    svg = html[html.index("<svg") : html.index("</svg>")]
    drawn_words = " ".join(re.sub(r"<[^>]+>", " ", svg).split())
    for step in steps:
        asked = step["text"].partition(" -> ")[0]
        for word in asked.replace("&", "&amp;").replace("'", "&#x27;").split():
            assert word in drawn_words, (word, step["text"])
    assert "\u2026" not in svg  # no ellipsis: nothing is cut
    # Replies come back to their caller, and the verifier's actual answer is shown.
    assert 'class="reply"' in svg
    assert "answered confirmed" in svg
    assert "What to fix:" in html


def test_a_page_with_no_violation_states_the_result(tmp_path: Path) -> None:
    page = tmp_path / "none.html"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dataoad",
            "check",
            "examples/adapters/payment_adapter.py",
            "--max-examples",
            "4",
            "--html",
            str(page),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = page.read_text(encoding="utf-8")
    assert "No violation found in 4 examples" in text
    assert "not a proof" in text
    assert "<svg" not in text  # nothing to draw


def test_text_is_escaped_and_lanes_follow_the_gates() -> None:
    events = [
        SimpleNamespace(actor="contender A", text="execute order-1 <script>alert(1)</script>"),
        SimpleNamespace(actor="contender A", text="ledger.start_attempt: fail before write"),
        SimpleNamespace(actor="contender B", text="provider.charge: none"),
        SimpleNamespace(actor="provider", text="gives up 1 in-flight request(s) for ref-order-1"),
    ]
    steps = steps_from_history(events)
    assert [s.touches for s in steps] == [
        {},
        {"ledger": "start_attempt: fail before write"},
        {"provider": "charge: none"},
        {},
    ]
    assert [s.fault for s in steps] == [False, True, False, True]
    html = render_html("runner machine", steps, "invariant x broken")
    _self_contained(html)
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert re.findall(r'data-step="(\d+)"', html) == ["1", "2", "3", "4"]


def test_adapter_steps_touch_provider_verifier_and_ledger() -> None:
    [step] = steps_from_adapter(
        [
            {
                "number": 1,
                "actor": "contender A",
                "text": "execute order-1 (policy default; provider: none; verifier read: stale) "
                "-> UNKNOWN",
                "provider": "ref-order-1 has 1 effect",
                "ledger": "COMPLETED UNKNOWN",
            }
        ]
    )
    assert step.touches == {
        "provider": "ref-order-1 has 1 effect",
        "verifier": "stale",
        "ledger": "COMPLETED UNKNOWN",
    }
    assert step.fault  # a stale read is a fault


def test_a_state_machine_failure_writes_its_picture(tmp_path: Path) -> None:
    from stateful_tests.harness import History, violation

    os.environ["DATAOAD_TRACE_DIR"] = str(tmp_path)
    try:
        history = History("runner-machine-example")
        history.add("contender A", "execute order-1")
        history.add("contender A", "provider.charge: timeout after commit")
        error = violation(history, "no-second-mutation-after-unknown", "charged twice")
    finally:
        del os.environ["DATAOAD_TRACE_DIR"]
    page = tmp_path / "runner-machine-example.html"
    assert str(page.resolve()) in str(error)
    html = page.read_text()
    _self_contained(html)
    assert re.findall(r'data-step="(\d+)"', html) == ["1", "2"]
    assert "no-second-mutation-after-unknown" in html


def test_check_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    quiet, _, _ = _check(tmp_path, "--max-examples", "20")
    assert quiet.stderr == ""
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "dataoad", "check", *CHECK, "--max-examples", "20"],
        stdout=subprocess.DEVNULL,
        stderr=follower,
        cwd=ROOT,
    )
    os.close(follower)
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert child.wait(timeout=120) == 1
    text = seen.decode(errors="replace")
    assert "searching: 1 examples tried" in text
    assert "shrinking the counterexample" in text


def _artifacts() -> Path:
    folder = Path(os.environ.get("DATAOAD_ARTIFACTS", ROOT / "test-artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_a_real_browser_draws_every_step(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        unavailable("Debian's chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (the dev extra)")
    done, page, trace = _check(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    steps = json.loads(trace.read_text())["violation"]["steps"]
    shot = _artifacts() / "dataoad-check-trace.png"
    with sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 900})
            requests: list[str] = []
            tab.on("request", lambda r: requests.append(r.url))
            tab.goto(page.as_uri())
            drawn = tab.locator("g[data-step]")
            assert drawn.count() == len(steps)
            for index in range(drawn.count()):
                box = drawn.nth(index).bounding_box()
                assert box is not None
                assert box["width"] > 0
                assert box["height"] > 0
            numbers = tab.locator("g[data-step] text.number").all_text_contents()
            assert numbers == [str(s["number"]) for s in steps]
            tab.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert requests == [page.as_uri()], "the page fetched something besides itself"
    assert shot.stat().st_size > 10_000
