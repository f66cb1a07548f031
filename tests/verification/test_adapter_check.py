"""``dataoad check`` on the example adapters: the correct one passes, each bug is named."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from dataoad.testing import (
    ProviderAdapter,
    ReadFault,
    SandboxFault,
    adapter_test_case,
    check_adapter,
)

# Slow (each case runs a Hypothesis search over an adapter): left out of the quick loop, python -m pytest -m "not slow".
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = ROOT / "examples" / "adapters"

#: Each planted adapter bug and the invariant its trace must name.
BUGGY = {
    "bug_wrong_reference.py": "verifier-names-the-receipts-reference",
    "bug_absent_while_in_flight.py": "retry-safe-absence-only-when-final",
    "bug_stale_read_healthy.py": "retry-safe-absence-only-when-final",
    "bug_wraps_every_error.py": "definitive-failure-only-when-nothing-committed",
    "bug_swallows_verifier_errors.py": "retry-safe-absence-only-when-final",
    "bug_trusts_the_response.py": "confirmed-only-with-the-effect",
}


def dataoad_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataoad", "check", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )


def test_the_correct_adapter_passes(tmp_path: Path) -> None:
    junit, trace, page = tmp_path / "check.xml", tmp_path / "trace.json", tmp_path / "trace.html"
    trace.write_text("an older report, readable by all\n")
    trace.chmod(0o644)
    done = dataoad_check(
        "examples/adapters/payment_adapter.py",
        "--junit-xml",
        str(junit),
        "--trace-json",
        str(trace),
        "--html",
        str(page),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "none found in" in done.stdout
    assert "verified" not in done.stdout.lower()
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0"
    assert json.loads(trace.read_text())["violation"] is None
    # Owner-only, like the ledger file and the prune export (the one there before too).
    assert {stat.S_IMODE(p.stat().st_mode) for p in (junit, trace, page)} == {0o600}


def test_a_report_path_that_is_not_a_regular_file_is_refused_before_the_search(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "check.xml"
    os.mkfifo(fifo)  # a reader-less FIFO: writing to it would block for good
    done = dataoad_check("examples/adapters/payment_adapter.py", "--junit-xml", str(fifo))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not a regular file" in done.stderr
    assert done.stdout == "", "the search ran"


def test_a_report_path_that_is_a_link_is_refused_before_the_search(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.xml"
    elsewhere.write_text("keep me\n")
    (tmp_path / "check.xml").symlink_to(elsewhere)
    done = dataoad_check(
        "examples/adapters/payment_adapter.py", "--junit-xml", str(tmp_path / "check.xml")
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is a symbolic link" in done.stderr
    assert done.stdout == "", "the search ran"
    assert elsewhere.read_text() == "keep me\n"


@pytest.mark.parametrize(("filename", "invariant"), sorted(BUGGY.items()))
def test_each_buggy_adapter_fails_naming_its_invariant(
    tmp_path: Path, filename: str, invariant: str
) -> None:
    trace = tmp_path / "trace.json"
    junit = tmp_path / "check.xml"
    # Seeded, so that CI reruns the same search (each bug is found by other
    # seeds too; how long a search takes is measured, not asserted here).
    done = dataoad_check(
        f"examples/adapters/{filename}",
        "--seed",
        "1",
        "--trace-json",
        str(trace),
        "--junit-xml",
        str(junit),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"VIOLATION of {invariant}" in done.stdout
    report = json.loads(trace.read_text())
    violation = report["violation"]
    assert violation["invariant"] == invariant
    assert violation["shrunk"] is True
    assert "Shrunk trace (" in done.stdout
    steps = violation["steps"]
    assert 1 < len(steps) <= 12, steps
    assert [s["number"] for s in steps] == list(range(1, len(steps) + 1))
    assert steps[-1]["actor"] == "checker"
    assert invariant in steps[-1]["text"]
    # Every contender step says what the provider holds and what the ledger recorded.
    assert all("provider" in s and "ledger" in s for s in steps if s["actor"] != "checker")
    # A step whose verifier was asked says what it answered; the report says what to fix.
    asked = [s for s in steps if "verifier" in s]
    assert all(s["verifier"].startswith(("answered ", "raised ", "returned ")) for s in asked)
    assert violation["fix"]
    assert f"What to fix: {violation['fix']}" in done.stdout
    assert report["seconds"] >= 0
    failure = ET.parse(junit).getroot().find("testcase/failure")
    assert failure is not None
    assert failure.get("message") == invariant


def test_the_same_seed_gives_the_same_trace(tmp_path: Path) -> None:
    traces = []
    for n in range(2):
        out = tmp_path / f"trace{n}.json"
        done = dataoad_check(
            "examples/adapters/bug_wraps_every_error.py", "--seed", "7", "--trace-json", str(out)
        )
        assert done.returncode == 1
        traces.append(json.loads(out.read_text())["violation"]["steps"])
    assert traces[0] == traces[1]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("examples/adapters/missing.py", "no such file"),
        ("not_a_module_xyz:Adapter", "cannot import"),
        ("examples.adapters.payment_adapter:Nope", "no attribute"),
        ("examples.adapters.payment_adapter:SANDBOX_FAULTS", "not a ProviderAdapter"),
        ("no-colon-here", "module:attribute"),
    ],
)
def test_usage_errors_exit_2_with_one_line(target: str, message: str) -> None:
    done = dataoad_check(target)
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_file_with_several_adapters_must_name_one(tmp_path: Path) -> None:
    source = (
        "from dataoad.testing import ProviderAdapter\n"
        "class A(ProviderAdapter): pass\n"
        "class B(ProviderAdapter): pass\n"
    )
    (tmp_path / "two.py").write_text(source)
    done = dataoad_check(str(tmp_path / "two.py"))
    assert done.returncode == 2
    assert "exactly one" in done.stderr


def test_module_attribute_target_and_budget_flags() -> None:
    done = dataoad_check(
        "examples.adapters.payment_adapter:PaymentAdapter", "--max-examples", "5", "--seed", "1"
    )
    assert done.returncode == 0, done.stderr
    assert "none found in 5 examples" in done.stdout


def test_every_target_form_the_report_prints_is_accepted() -> None:
    first = dataoad_check("examples/adapters/payment_adapter.py", "--max-examples", "3")
    assert first.returncode == 0, first.stderr
    printed = first.stdout.splitlines()[0].removeprefix("dataoad check ")
    assert printed == "examples/adapters/payment_adapter.py:PaymentAdapter"
    again = dataoad_check(printed, "--max-examples", "3")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0] == first.stdout.splitlines()[0]
    missing = dataoad_check("examples/adapters/payment_adapter.py:Nope")
    assert missing.returncode == 2
    assert "defines no 'Nope'" in missing.stderr


@pytest.mark.parametrize("option", ["--html", "--trace-json", "--junit-xml"])
@pytest.mark.parametrize(
    ("where", "reason"), [("no/such/folder/out.txt", "does not exist"), (".", "is a folder")]
)
def test_a_bad_output_path_is_refused_before_the_search(
    tmp_path: Path, option: str, where: str, reason: str
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dataoad",
            "check",
            str(ROOT / "examples/adapters/payment_adapter.py"),
            option,
            where,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert reason in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # no traceback
    assert done.stdout == "", "the search ran"


def test_files_are_written_even_when_the_reader_stops_early(tmp_path: Path) -> None:
    junit = tmp_path / "check.xml"
    command = (
        f"{sys.executable} -m dataoad check examples/adapters/bug_wrong_reference.py --seed 1 "
        # The reader is gone long before the report is printed: a sure broken pipe.
        f"--junit-xml {junit} | true"
    )
    done = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert "BrokenPipeError" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert ET.parse(junit).getroot().get("failures") == "1"


def _adapter(module: str, name: str) -> Any:
    sys.path.insert(0, str(ROOT))
    try:
        mod = __import__(f"examples.adapters.{module}", fromlist=[name])
    finally:
        sys.path.remove(str(ROOT))
    return getattr(mod, name)


def test_pytest_entry_point_passes_a_correct_adapter() -> None:
    case = adapter_test_case(_adapter("payment_adapter", "PaymentAdapter"), max_examples=30)
    result = case("test_adapter_keeps_the_contract").run()
    assert result is not None
    assert result.wasSuccessful(), result.failures


def test_pytest_entry_point_fails_a_buggy_adapter_with_the_trace() -> None:
    case = adapter_test_case(_adapter("bug_wraps_every_error", "WrapsEveryErrorAdapter"))
    result = case("test_adapter_keeps_the_contract").run()
    assert result is not None
    assert not result.wasSuccessful()
    [(_, text)] = result.failures
    assert "definitive-failure-only-when-nothing-committed" in text
    assert "Shrunk trace" in text


def test_unimplemented_fault_controls_are_skipped_and_reported() -> None:
    base = _adapter("payment_adapter", "PaymentAdapter")

    class NoFaultControls(base):  # type: ignore[misc, valid-type]
        def stage_sandbox_fault(self, fault: Any) -> None:
            raise NotImplementedError

        def stage_read_fault(self, fault: Any) -> None:
            raise NotImplementedError

    report = check_adapter(NoFaultControls(), max_examples=10)
    assert report.passed
    assert len(report.skipped_faults) == len(SandboxFault) + len(ReadFault)
    assert "skipped fault: sandbox: declines before any effect" in report.render()


def test_an_adapter_mapping_older_faults_skips_only_the_new_ones() -> None:
    """A fault table written before a fault existed (a KeyError) skips that fault alone."""
    module = _adapter("payment_adapter", "PaymentAdapter")
    older = {
        fault: charge
        for fault, charge in _adapter("payment_adapter", "SANDBOX_FAULTS").items()
        if fault is not SandboxFault.DECLINED_LATER
    }

    class OlderTable(module):  # type: ignore[misc, valid-type]
        def stage_sandbox_fault(self, fault: Any) -> None:
            self.provider.add_charge_fault(older[fault])

    report = check_adapter(OlderTable(), max_examples=10)
    assert report.passed
    assert report.skipped_faults == [f"sandbox: {SandboxFault.DECLINED_LATER.value}"]


def test_check_adapter_refuses_what_is_not_an_adapter() -> None:
    with pytest.raises(TypeError):
        check_adapter(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="profile"):
        check_adapter(ProviderAdapter(), profile="nightly")
