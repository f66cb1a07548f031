"""The documentation site: the tutorial's output is real, its excerpts are the
files it runs, and ``mkdocs build --strict`` passes (the docs extra).
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from suite_support.services import tool

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
CONSOLE = re.compile(r"```console\n(.*?)```", re.DOTALL)
EXCERPT = re.compile(r'```python title="(?P<file>[^" ]+)[^"]*"\n(?P<code>.*?)```', re.DOTALL)
ACTION_ID = re.compile(r"\b[0-9a-f]{32}\b")
TIMES = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(\+00:00)?")


def normalise(text: str, folder: Path) -> list[str]:
    text = text.replace(str(folder), "dataoad-tutorial")
    text = TIMES.sub("<time>", ACTION_ID.sub("<action-id>", text))
    return [line.rstrip() for line in text.strip().splitlines()]


def steps() -> list[tuple[str, str]]:
    """(command, expected output) for every ``$`` line of the tutorial's console blocks."""
    found: list[tuple[str, str]] = []
    for block in CONSOLE.findall(TUTORIAL.read_text(encoding="utf-8")):
        command = ""
        output: list[str] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                if command:
                    found.append((command, "\n".join(output)))
                command, output = line[2:], []
            else:
                output.append(line)
        found.append((command, "\n".join(output)))
    return found


def test_the_tutorial_prints_what_it_shows(tmp_path: Path) -> None:
    folder = tmp_path / "dataoad-tutorial"
    env = {**os.environ, "DATAOAD_TUTORIAL_DIR": str(folder)}
    action_id = ""
    ran = 0
    for command, expected in steps():
        if command.startswith("cd "):
            continue  # the commands below run in docs/tutorial
        argv = shlex.split(command.replace("dataoad-tutorial/", f"{folder}/"))
        if action_id:
            argv = [ACTION_ID.sub(action_id, arg) for arg in argv]
        if argv[0] == "python":
            argv[0] = sys.executable
        elif argv[0] == "dataoad":
            argv = [sys.executable, "-m", "dataoad", *argv[1:]]
        done = subprocess.run(
            argv,
            cwd=ROOT / "docs" / "tutorial",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        output = done.stdout
        if done.returncode == -signal.SIGKILL:
            output += "Killed\n"  # what the shell prints for it
        else:
            assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        action_id = action_id or next(iter(ACTION_ID.findall(output)), "")
        assert normalise(output, folder) == normalise(expected, folder), command
        ran += 1
    assert ran >= 6


def test_the_tutorials_claim_outlasts_any_readers_pace(tmp_path: Path) -> None:
    """The worker's lease is an hour, and the tutorial says so: a reader who takes 33 s
    between steps (longer than the default 30 s lease) sees the same outputs."""
    folder = tmp_path / "dataoad-tutorial"
    env = {**os.environ, "DATAOAD_TUTORIAL_DIR": str(folder)}
    subprocess.run(
        [sys.executable, "worker.py"], cwd=ROOT / "docs" / "tutorial", env=env, check=False
    )
    from dataoad.ledgers.sqlite_reader import SQLiteReader

    async def read() -> Any:
        reader = SQLiteReader(folder / "ledger.sqlite3")
        try:
            return await reader.receipts(pending=True)
        finally:
            await reader.close()

    (claim,) = asyncio.run(read())
    assert claim.lease_expires_at is not None
    assert claim.lease_expires_at - claim.stored_at >= timedelta(hours=1)
    assert "lease=3600" in TUTORIAL.read_text(encoding="utf-8")


def public_names() -> list[tuple[str, str]]:
    """(module, name) for every name in the ``__all__`` of dataoad, dataoad.testing and each
    dataoad.integrations module."""
    import importlib
    import pkgutil

    import dataoad.integrations

    modules = ["dataoad", "dataoad.testing"] + [
        f"dataoad.integrations.{m.name}"
        for m in pkgutil.iter_modules(dataoad.integrations.__path__)
        if not m.name.startswith("_")
    ]
    found = []
    for module in modules:
        names = getattr(importlib.import_module(module), "__all__", [])
        found += [(module, name) for name in names if not name.startswith("__")]
    return found


def test_public_names_are_found_in_every_module() -> None:
    names = public_names()
    assert ("dataoad", "ActionRunner") in names
    assert ("dataoad.testing", "check_adapter") in names
    assert ("dataoad.integrations.langgraph", "guarded_node") in names


@pytest.mark.parametrize(
    "page",
    [
        TUTORIAL,
        *sorted(
            p for p in (ROOT / "docs" / "how-to" / "engines").glob("*.md") if p.name != "index.md"
        ),
    ],
    ids=lambda p: p.name,
)
def test_excerpts_are_the_files_they_name(page: Path) -> None:
    excerpts = list(EXCERPT.finditer(page.read_text(encoding="utf-8")))
    assert excerpts
    for m in excerpts:
        source = (ROOT / m["file"]).read_text(encoding="utf-8")
        # An excerpt from inside a function is shown dedented, and ruff formats
        # the page as a module (two blank lines between definitions).
        assert any(
            squeeze(textwrap.indent(m["code"], " " * depth, lambda line: bool(line.strip())))
            in squeeze(source)
            for depth in (0, 4, 8)
        ), f"the excerpt of {m['file']} is not in it"


def squeeze(text: str) -> str:
    """``text`` with every run of blank lines made one."""
    return re.sub(r"\n(?:[ \t]*\n)+", "\n\n", text)


def test_mkdocs_builds_the_site_strictly(tmp_path: Path) -> None:
    # What following the tutorial leaves in docs/ must never be published.
    leftovers = ROOT / "docs" / "tutorial" / "dataoad-tutorial"
    made = not leftovers.exists()
    leftovers.mkdir(exist_ok=True)
    probe = leftovers / f"probe-{os.getpid()}.sqlite3"
    probe.write_bytes(b"")
    try:
        _build_and_check(tmp_path)
    finally:
        probe.unlink()
        if made:
            leftovers.rmdir()


def _build_and_check(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *tool("mkdocs", extra="docs", required=False),
            "build",
            "--strict",
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    # Pages are files (page.html), so a site opened from disk never lists a folder.
    assert (site / "reference" / "api.html").exists()
    index = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="tutorial.html"' in index
    assert not list(site.rglob("*.sqlite3")), "the tutorial's ledger was published"
    # Every public name has its entry in the built API reference.
    anchors = set(
        re.findall(r'id="(dataoad[\w.]*)"', (site / "reference" / "api.html").read_text())
    )
    missing = [
        f"{module}.{name}"
        for module, name in public_names()
        if f"{module}.{name}" not in anchors
        and not any(a.endswith(f".{name}") and a.startswith(f"{module}._") for a in anchors)
    ]
    assert not missing, f"public names missing from the API reference: {missing}"
    # Signatures are wrapped (one parameter a line), never one cut-off line.
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    signatures = re.findall(r'<div class="doc-signature[^"]*"[^>]*>(.*?)</div>', api, re.S)
    assert signatures
    text = html.unescape(re.sub(r"<[^>]+>", "", "\n".join(signatures)))
    assert max(len(line) for line in text.splitlines()) <= 100
    assert not (site / "tutorial" / "dataoad-tutorial").exists()


@pytest.mark.parametrize(
    "page", sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
)
def test_every_page_is_in_the_navigation(page: str) -> None:
    assert page in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_the_see_your_metrics_snippet_prints_the_metrics(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "how-to" / "monitoring.md").read_text(encoding="utf-8")
    section = text[text.index("## See your metrics") :]
    start = section.index("```python\n") + len("```python\n")
    code = section[start : section.index("\n```", start)]
    script = tmp_path / "metrics.py"
    script.write_text(code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    for name in ("dataoad.actions", "dataoad.execute.duration", "dataoad.receipts.unknown"):
        assert f'"name": "{name}"' in done.stdout, name
