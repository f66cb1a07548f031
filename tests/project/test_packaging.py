"""What a user installs: the wheel's and sdist's contents, its metadata, and typing.

The ``dataoad`` on the public package index is an unrelated project, so
these tests build the distributions from this checkout.
"""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from suite_support.services import tool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Builders warn about deprecated license metadata; ours must not.
    assert "deprecat" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    return out


def test_the_wheel_holds_the_library_typed_and_no_tests(dist: Path) -> None:
    (wheel,) = dist.glob("dataoad-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"dataoad", f"{wheel.name.split('-py3')[0]}.dist-info"}, top
    assert "dataoad/py.typed" in names
    assert "dataoad/testing/_payment.py" in names
    assert not [n for n in names if "/tests/" in n or n.startswith("tests/")]


def test_the_wheel_metadata_has_an_spdx_license_and_current_pythons(dist: Path) -> None:
    (wheel,) = dist.glob("dataoad-*.whl")
    archive = zipfile.ZipFile(wheel)
    (meta_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    meta = email.message_from_bytes(archive.read(meta_name))
    assert meta["Version"] == "0.2.0.dev0"
    assert meta["License-Expression"] == "Apache-2.0"
    classifiers = meta.get_all("Classifier") or []
    assert not [
        c for c in classifiers if c.startswith("License ::")
    ]  # superseded by the SPDX field
    for minor in (11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"testing", "postgres", "otel", "docs"} <= extras


def test_the_sdist_carries_no_tests_but_the_examples_it_documents(dist: Path) -> None:
    (sdist,) = dist.glob("dataoad-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    top = {name.split("/")[1] for name in names if name.count("/") >= 1}
    assert not {"tests", "stateful_tests", "suite_support", "models", "benchmarks"} & top, top
    assert {"dataoad", "examples", "fault_scenarios", "README.md", "LICENSE"} <= top


def test_mypy_follows_the_editable_install_from_outside_the_checkout(tmp_path: Path) -> None:
    program = tmp_path / "user_code.py"
    program.write_text(
        "from dataoad import ActionResult, ActionRunner, InMemoryLedger\n\n\n"
        "async def main() -> None:\n"
        "    runner = ActionRunner(InMemoryLedger())\n"
        "    result: ActionResult[int] = await runner.execute(\n"
        '        "a", lambda: 1, request={}, idempotency_key="k"\n'
        "    )\n"
        "    print(result.status)\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [*tool("mypy"), "--strict", "--no-incremental", str(program)],
        cwd=tmp_path,  # outside the checkout: only the installed package can be found
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_requirement_states_a_lower_bound_ci_can_pin(tmp_path: Path) -> None:
    """CI's lowest-versions stage pins each direct requirement to its lower bound."""
    done = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "lower_bounds.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    pins = dict(line.split("==") for line in done.stdout.splitlines())
    assert pins["aiosqlite"] == "0.22.1", pins
    assert pins["hypothesis"] == "6.100", pins
    # A requirement with no lower bound is refused, naming it.
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "lower_bounds.py").write_text(
        (ROOT / ".ci" / "lower_bounds.py").read_text(encoding="utf-8"), encoding="utf-8"
    )
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["aiosqlite"]\n', encoding="utf-8"
    )
    refused = subprocess.run(
        [sys.executable, str(tmp_path / ".ci" / "lower_bounds.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0
    assert "'aiosqlite' states no lower bound" in refused.stderr
