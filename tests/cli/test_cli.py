"""``dataoad test`` as a user runs it: a subprocess, exit codes, text, JSON, JUnit."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "payment_timeout_after_commit.py"

SEED_LINES = [
    "Timeout-after-commit comparison",
    "Naive retry: calls=2, charges=2, total=5000 cents",
    "Dataoad:    execution=UNKNOWN, verification=CONFIRMED, final=CONFIRMED, calls=1, charges=1",
    "Action: charge_customer",
    "Final classification:",
    "SAFE UNDER TESTED CONDITIONS",
]
SEED_CHECKS = [
    "Normal success",
    "Explicit pre-side-effect failure",
    "Replay safety",
    "Concurrent duplicate safety",
    "Same-key/body conflict",
    "Timeout-before-commit recovery",
    "Timeout-after-commit recovery",
    "Unknown auto-retry protection",
    "Verifier unavailable handling",
    "Unhealthy false-negative handling",
    "wrong-verification-identity",
    "unknown-evidence-erasure",
]


def dataoad(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataoad", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


def normalise(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


SEED_REPORT = """\
Timeout-after-commit comparison
  Naive retry: calls=2, charges=2, total=5000 cents
  Dataoad:    execution=UNKNOWN, verification=CONFIRMED, final=CONFIRMED, calls=1, charges=1

Action: charge_customer

Normal success                     PASS
Explicit pre-side-effect failure   PASS
Replay safety                      PASS
Concurrent duplicate safety        PASS
Same-key/body conflict             PASS
Timeout-before-commit recovery     PASS
Timeout-after-commit recovery      PASS
Unknown auto-retry protection      PASS
Verifier unavailable handling      PASS
Unhealthy false-negative handling  PASS
wrong-verification-identity        PASS
unknown-evidence-erasure           PASS

Final classification:
SAFE UNDER TESTED CONDITIONS
"""


def test_example_prints_the_seed_report_line_for_line() -> None:
    done = dataoad("test", str(EXAMPLE))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == SEED_REPORT.strip()


def test_example_prints_every_line_of_the_seed_report() -> None:
    done = dataoad("test", str(EXAMPLE))
    assert done.returncode == 0, done.stderr
    for line in SEED_LINES:
        assert line in done.stdout
    lines = {
        normalise(line.rsplit(" ", 1)[0]): line.rsplit(" ", 1)[1]
        for line in done.stdout.splitlines()
        if line.endswith(("PASS", "FAIL"))
    }
    for name in SEED_CHECKS:
        assert lines.get(normalise(name)) == "PASS", name


def test_json_and_junit_outputs(tmp_path: Path) -> None:
    junit = tmp_path / "report.xml"
    done = dataoad("test", str(EXAMPLE), "--format", "json", "--junit-xml", str(junit))
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["passed"] is True
    assert payload["classification"] == "SAFE UNDER TESTED CONDITIONS"
    assert len(payload["checks"]) == 12
    assert all(c["passed"] is True for c in payload["checks"])
    assert stat.S_IMODE(junit.stat().st_mode) == 0o600  # owner-only, as every report
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert suite.get("tests") == "12"
    assert suite.get("failures") == "0"


def test_failing_suite_exits_1(tmp_path: Path) -> None:
    suite = tmp_path / "failing.py"
    suite.write_text(
        "from dataoad.testing import SafetyCheck, SafetyReport\n"
        "def run_safety_suite():\n"
        "    return SafetyReport('a', [SafetyCheck('good', True), SafetyCheck('bad', False, 'why')])\n"
    )
    done = dataoad("test", str(suite))
    assert done.returncode == 1
    assert "UNSAFE UNDER TESTED CONDITIONS" in done.stdout
    assert "bad" in done.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("x = 1\n", "defines no run_safety_suite"),
        ("def run_safety_suite():\n    raise RuntimeError('boom')\n", "raised RuntimeError: boom"),
        ("def run_safety_suite():\n    return {'passed': True}\n", "not a SafetyReport"),
        ("import not_a_module_anywhere\n", "failed to import"),
        # An exit would end the command with the suite's status: 0, a silent pass.
        ("import sys\nsys.exit(0)\n", "called sys.exit(0) while being imported"),
        ("import sys\ndef run_safety_suite():\n    sys.exit(0)\n", "raised SystemExit: 0"),
        (
            "from dataoad.testing import SafetyCheck, SafetyReport\n"
            "def run_safety_suite():\n    return SafetyReport('a', [SafetyCheck('c', 'false')])\n",
            "SafetyCheck.passed must be exactly True or False",
        ),
    ],
)
def test_load_problems_exit_2_with_one_line(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "suite.py"
    if content is not None:
        path.write_text(content)
    done = dataoad("test", str(path))
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_async_suite_is_awaited(tmp_path: Path) -> None:
    path = tmp_path / "suite.py"
    path.write_text(
        "from dataoad.testing import SafetyCheck, SafetyReport\n"
        "async def run_safety_suite():\n    return SafetyReport('a', [SafetyCheck('c', True)])\n"
    )
    assert dataoad("test", str(path)).returncode == 0


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    path = tmp_path / "suite.py"
    path.write_text("def run_safety_suite():\n    raise RuntimeError('boom')\n")
    done = dataoad("test", str(path), "--debug")
    assert done.returncode == 2
    assert "Traceback" in done.stderr


def test_version_and_help() -> None:
    version = dataoad("--version")
    assert version.returncode == 0
    assert version.stdout.startswith("dataoad ")
    helped = dataoad("--help")
    assert helped.returncode == 0
    assert "test" in helped.stdout
    assert dataoad().returncode == 2
    assert dataoad("test").returncode == 2
    assert dataoad("test", str(EXAMPLE), "--format", "yaml").returncode == 2
