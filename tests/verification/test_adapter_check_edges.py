"""``dataoad check`` at its edges: adapters that exit, hang, break their sandbox or print escapes.

Each adapter here is the bundled correct one (``examples/adapters/payment_adapter.py``)
with one thing changed, written to a file of the test's own.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dataoad.testing._adapter_watch import CallWatch, OverdueCall
from suite_support.cli import dataoad

# Slow (each case runs a search over an adapter): out of the quick loop.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

HEADER = """\
import asyncio
import sys
sys.path.insert(0, {root!r})
from dataoad import ActionStatus, VerificationResult
from examples.adapters.payment_adapter import PaymentAdapter as _Base
"""


def adapter_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "adapter.py"
    path.write_text(HEADER.format(root=str(ROOT)) + textwrap.dedent(body))
    return str(path)


#: A short search, the same every run.
SHORT_SEARCH = ("--seed", "1", "--max-examples", "5")


def overriding(tmp_path: Path, call: str, how: str) -> str:
    """The correct adapter with ``call`` (perform or verify) replaced by the lines ``how``."""
    return adapter_file(
        tmp_path, f"class Mine(_Base):\n    async def {call}(self, *args):\n        {how}\n"
    )


def dataoad_check(*args: str) -> subprocess.CompletedProcess[str]:
    return dataoad("check", *args, cwd=ROOT)


@pytest.mark.parametrize("code", ["0", "1"])
def test_an_adapter_file_that_exits_on_import_is_a_usage_error(tmp_path: Path, code: str) -> None:
    # Unguarded ``sys.exit(main())``: it once ended the check with its own
    # status, a silent pass for 0.
    target = adapter_file(tmp_path, f"class Mine(_Base):\n    pass\nsys.exit({code})\n")
    done = dataoad_check(target, "--max-examples", "5")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"called sys.exit({code})" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_factory_that_exits_is_a_usage_error(tmp_path: Path) -> None:
    target = adapter_file(tmp_path, "def adapter():\n    sys.exit(0)\n")
    done = dataoad_check(target, "--max-examples", "5")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "adapter() raised SystemExit" in done.stderr


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            """
            class Mine(_Base):
                def reset(self):
                    raise ConnectionError("sandbox is down")
            """,
            "ConnectionError: sandbox is down",
        ),
        (
            """
            class Mine(_Base):
                def effects(self, reference):
                    if super().effects(reference):
                        raise LookupError("the oracle broke")
                    return 0
            """,
            "LookupError: the oracle broke",
        ),
        (
            """
            class Mine(_Base):
                async def perform(self, request, reference):
                    sys.exit(0)
            """,
            "SystemExit: 0",
        ),
        (
            """
            class Mine(_Base):
                def effects(self, reference):
                    if super().effects(reference):
                        raise RuntimeError("a < b & <c>")
                    return 0
            """,
            "RuntimeError: a < b & <c>",
        ),
    ],
    ids=["reset", "effects", "perform exits", "markup in the message"],
)
def test_a_sandbox_hook_that_raises_ends_the_check_with_status_3_and_its_reports(
    tmp_path: Path, body: str, said: str
) -> None:
    trace, junit = tmp_path / "trace.json", tmp_path / "check.xml"
    done = dataoad_check(
        adapter_file(tmp_path, body),
        "--seed",
        "1",
        "--max-examples",
        "30",
        "--trace-json",
        str(trace),
        "--junit-xml",
        str(junit),
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert f"the check could not finish: the adapter raised {said}" in done.stdout
    report = json.loads(trace.read_text())
    assert said in report["error"]
    assert report["violation"] is None
    suite = ET.parse(junit).getroot()
    assert suite.get("errors") == "1"
    assert suite.get("failures") == "0"
    error = suite.find("testcase/error")
    assert error is not None
    assert said in (error.get("message") or "")  # escaped once: read back as written


def test_escape_sequences_from_the_adapter_never_reach_the_terminal_or_the_xml(
    tmp_path: Path,
) -> None:
    body = """
    EVIL = "\\x1b]0;title\\x07\\x1b[2J\\x1b[31mALL CHECKS PASSED\\x1b[0m\\r\\n2. forged"
    class Mine(_Base):
        async def verify(self, receipt):
            return VerificationResult.confirmed(verified_provider_reference=EVIL + "x" * 900)
    """
    junit = tmp_path / "check.xml"
    done = dataoad_check(
        adapter_file(tmp_path, body),
        "--seed",
        "1",
        "--max-examples",
        "50",
        "--junit-xml",
        str(junit),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "\x1b" not in done.stdout
    assert "\r" not in done.stdout
    assert "\\x1b]0;title" in done.stdout  # shown, escaped
    assert "x" * 200 not in done.stdout  # cut to a bound
    assert not any(line.startswith("2. forged") for line in done.stdout.splitlines())
    ET.parse(junit)  # well-formed


@pytest.mark.parametrize(
    ("call", "how"),
    [
        ("perform", "await asyncio.Event().wait()"),
        ("verify", "await asyncio.Event().wait()"),
        # Returns, but late: it blocked the loop, where no timer can fire.
        ("perform", "import time; time.sleep(0.2); return await super().perform(*args)"),
    ],
    ids=["perform hangs", "verify hangs", "perform blocks the loop"],
)
def test_a_call_that_never_returns_is_a_violation_within_the_call_timeout(
    tmp_path: Path, call: str, how: str
) -> None:
    done = dataoad_check(overriding(tmp_path, call, how), *SHORT_SEARCH, "--call-timeout", "0.05")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "VIOLATION of calls-return-within-the-call-timeout" in done.stdout
    assert f"{call} for ref-order-" in done.stdout


@pytest.mark.parametrize(
    ("call", "how"),
    [
        # Blocks the loop for good: the loop's timer never fires.
        ("perform", "import time; time.sleep(3600)"),
        # Swallows the timer's cancellation and waits on.
        (
            "verify",
            "while True:\n"
            "            try:\n"
            "                await asyncio.sleep(3600)\n"
            "            except asyncio.CancelledError:\n"
            "                pass",
        ),
    ],
    ids=["perform blocks the loop for good", "verify ignores its cancellation"],
)
def test_a_call_no_timer_can_end_ends_the_check_with_its_reports(
    tmp_path: Path, call: str, how: str
) -> None:
    trace, junit = tmp_path / "trace.json", tmp_path / "check.xml"
    began = time.monotonic()
    done = dataoad_check(
        overriding(tmp_path, call, how),
        *SHORT_SEARCH,
        "--call-timeout",
        "0.2",
        "--trace-json",
        str(trace),
        "--junit-xml",
        str(junit),
    )
    # Ended by the watch (twice the timeout and a second), not by the hour-long call.
    assert time.monotonic() - began < 60
    assert done.returncode == 1, done.stdout + done.stderr
    assert "VIOLATION of calls-return-within-the-call-timeout" in done.stdout
    assert f"{call} for ref-order-" in done.stdout
    assert "ignored the timer's cancellation" in done.stdout
    assert "Trace, not shrunk" in done.stdout
    violation = json.loads(trace.read_text())["violation"]
    assert violation["invariant"] == "calls-return-within-the-call-timeout"
    assert violation["steps"], "the running example's trace is reported"
    assert violation["shrunk"] is False
    assert ET.parse(junit).getroot().get("failures") == "1"


def test_a_healthy_decided_answer_naming_no_reference_is_a_violation(tmp_path: Path) -> None:
    body = """
    class Mine(_Base):
        async def verify(self, receipt):
            return VerificationResult(outcome=ActionStatus.CONFIRMED)
    """
    done = dataoad_check(adapter_file(tmp_path, body), "--seed", "1", "--max-examples", "100")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "VIOLATION of verifier-names-the-receipts-reference" in done.stdout
    assert "CONFIRMED naming no reference" in done.stdout


@pytest.mark.parametrize("seconds", ["0.0009", "3600.1", "nan", "-1"])
def test_a_call_timeout_out_of_its_bounds_is_refused(seconds: str) -> None:
    done = dataoad_check("examples/adapters/payment_adapter.py", "--call-timeout", seconds)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--call-timeout must be in [0.001, 3600] seconds" in done.stderr


@pytest.mark.parametrize("seconds", ["0.001", "3600"])
def test_a_call_timeout_at_its_bounds_is_taken(seconds: str) -> None:
    done = dataoad_check(
        "examples/adapters/payment_adapter.py",
        "--max-examples",
        "1",
        "--seed",
        "1",
        "--call-timeout",
        seconds,
    )
    # 1 ms may be too short for a call: then it is reported as a violation,
    # never refused as usage.
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert "must be in" not in done.stderr


def test_a_call_that_never_returns_ends_the_check_even_if_its_reports_cannot_be_written(
    tmp_path: Path,
) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    # The call takes the reports' folder away, then blocks the loop for good.
    how = f"import shutil, time; shutil.rmtree({str(reports)!r}); time.sleep(3600)"
    began = time.monotonic()
    done = dataoad_check(
        overriding(tmp_path, "perform", how),
        *SHORT_SEARCH,
        "--call-timeout",
        "0.2",
        "--trace-json",
        str(reports / "trace.json"),
    )
    assert time.monotonic() - began < 60
    assert done.returncode == 2, done.stdout + done.stderr  # the report file, not the adapter
    assert "--trace-json" in done.stderr
    assert "VIOLATION of calls-return-within-the-call-timeout" in done.stdout


def test_the_watch_reports_only_a_call_still_running_past_its_limit() -> None:
    seen: list[OverdueCall] = []
    steps: list[dict[str, object]] = [{"number": 1, "actor": "A", "text": "claims"}]
    with CallWatch(0.2, seen.append, poll=0.01) as watch:
        watch.started("perform", "ref-1", steps)
        watch.ended()  # returned in time: nothing to report
        time.sleep(0.3)
        assert seen == []
        watch.examples = 4
        watch.started("verify", "ref-2", steps)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(seen) == 1
    late = seen[0]
    assert (late.call, late.reference, late.examples) == ("verify", "ref-2", 4)
    assert late.seconds >= 0.2
    steps.append({"number": 2, "actor": "B", "text": "later"})
    assert len(late.steps) == 1  # a copy, taken when it was late
