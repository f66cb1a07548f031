"""The shape of the suite itself: async tests are written as async tests.

A test that defines a coroutine only to run it once (``asyncio.run(inner())``
or ``await inner()``) hides its body one level down; once, such a wrapper was
never called at all and its test could not fail. pytest-asyncio runs
``async def`` tests directly, so the wrapper is never needed.
"""

from __future__ import annotations

import ast
import fnmatch
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _runs_once(node: ast.AST, name: str) -> bool:
    """Whether ``node`` is a statement that only runs ``name()`` (awaited or ``asyncio.run``).

    Only a bare statement: a coroutine whose result the test goes on to use
    is a phase of the test (before and after a restart, say), not a wrapper.
    """
    if not isinstance(node, ast.Expr):
        return False
    value = node.value
    if isinstance(value, ast.Await):
        value = value.value
    elif (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "run"
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == "asyncio"
        and len(value.args) == 1
    ):
        value = value.args[0]
    else:
        return False
    return (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == name
    )


def wrapped_tests(source: str) -> list[str]:
    """Tests in ``source`` that hide their body in a coroutine they only run once.

    In an async test, awaiting a coroutine defined for the purpose never
    helps. A sync test may need several event loops (a restart) or sync
    work around them (a CLI, a subprocess); one that does nothing but run
    its inner coroutine is an async test written the long way.
    """
    found = []
    for test in ast.walk(ast.parse(source)):
        if not isinstance(test, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not test.name.startswith("test"):
            continue
        loops = [
            n
            for n in ast.walk(test)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "run"
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id == "asyncio"
        ]
        for inner in test.body:
            if not isinstance(inner, ast.AsyncFunctionDef) or inner.decorator_list:
                continue  # a decorated one is under test (``@guarded``), not a wrapper
            uses = [n for n in ast.walk(test) if isinstance(n, ast.Name) and n.id == inner.name]
            runs = [s for s in test.body if _runs_once(s, inner.name)]
            if len(uses) != 1 or len(runs) != 1:
                continue
            body = [
                s
                for s in test.body
                if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            ]
            awaited = isinstance(test, ast.AsyncFunctionDef)
            if awaited or (len(loops) == 1 and body == [inner, runs[0]]):
                found.append(f"{test.name} wraps its body in {inner.name}()")
    return found


def test_no_test_wraps_its_body_in_an_inner_coroutine() -> None:
    offenders = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for found in wrapped_tests(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(ROOT)}: {found}")
    assert offenders == []


def test_the_check_sees_a_wrapper() -> None:
    source = (
        "import asyncio\n"
        "def test_a():\n"
        "    async def scenario():\n"
        "        pass\n"
        "    asyncio.run(scenario())\n"
        "async def test_b():\n"
        "    async def body():\n"
        "        pass\n"
        "    await body()\n"
        "async def test_e():\n"
        "    async def first():\n"
        "        return 1\n"
        "    receipt = await first()\n"
        "    assert receipt\n"
        "async def test_c():\n"
        "    async def held():\n"
        "        pass\n"
        "    task = asyncio.create_task(held())\n"
        "    await task\n"
        "def test_d():\n"
        "    async def before():\n"
        "        pass\n"
        "    asyncio.run(before())\n"
        "    subprocess.run(['dataoad', 'recover'])\n"
        "def test_f():\n"
        '    """A docstring."""\n'
        "    async def main():\n"
        "        pass\n"
        "    asyncio.run(main())\n"
    )
    assert wrapped_tests(source) == [
        "test_a wraps its body in scenario()",
        "test_b wraps its body in body()",
        "test_f wraps its body in main()",
    ]


def _unselected(root: Path) -> list[str]:
    """Test files of the mutated code's rooms that the mutation run neither selects nor excuses."""
    from stateful_tests import mutation_score as score

    selected = {t.split("::")[0] for t in score.TESTS}
    missing = []
    for room in score.SELECTED_ROOMS:
        for path in sorted((root / "tests" / room).glob("test_*.py")):
            name = path.relative_to(root).as_posix()
            if (
                name not in selected
                and name not in score.NOT_SELECTED
                and not fnmatch.fnmatch(name, score.NOT_SELECTED_PATTERN)
            ):
                missing.append(name)
    return missing


def test_the_mutation_run_selects_every_test_of_the_rooms_it_mutates() -> None:
    assert _unselected(ROOT) == []


def test_the_mutation_selection_check_sees_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "tests" / "leases").mkdir(parents=True)
    (tmp_path / "tests" / "leases" / "test_forgotten.py").write_text("")
    assert _unselected(tmp_path) == ["tests/leases/test_forgotten.py"]


def test_every_excused_or_selected_test_file_exists() -> None:
    from stateful_tests import mutation_score as score

    named = {t.split("::")[0] for t in score.TESTS} | set(score.NOT_SELECTED)
    assert sorted(n for n in named if not (ROOT / n).exists()) == []


def _modules_without_mutants(modules: list[str], patterns: list[str]) -> list[str]:
    """Modules of the run whose mutants no pattern scores (they would be mutated, then ignored)."""
    dotted = {m: m.removesuffix(".py").replace("/", ".") + "." for m in modules}
    return [m for m in modules if not any(p.startswith(dotted[m]) for p in patterns)]


def test_every_safety_critical_module_is_scored() -> None:
    """`_completing` was mutated by --safety-critical but matched by no pattern until 2026-12-04."""
    from stateful_tests import mutation_score as score

    assert (
        _modules_without_mutants(score.SAFETY_CRITICAL_MODULES, score.SAFETY_CRITICAL_MUTANTS) == []
    )
    assert _modules_without_mutants(["dataoad/_completing.py"], ["dataoad._attempts.*"]) == [
        "dataoad/_completing.py"
    ]


def test_a_triage_counts_only_for_the_mutated_code_it_was_written_for(tmp_path: Path) -> None:
    from stateful_tests import mutation_triage as triage

    listed = tmp_path / "equivalents.txt"
    listed.write_text(
        "# a comment\n"
        "m.x_f__mutmut_1\tcase only\tsql = 'SELECT'\n"
        "m.x_f__mutmut_2\tolder entry, no code recorded\n"
    )
    known = triage.reviewed(listed)
    assert known["m.x_f__mutmut_1"] == triage.Triage("case only", "sql = 'SELECT'")
    assert known["m.x_f__mutmut_2"] == triage.Triage("older entry, no code recorded", None)
    assert triage.stale_triage(known, {"m.x_f__mutmut_1": "sql = 'SELECT'"}) == {}
    stale = triage.stale_triage(
        known, {"m.x_f__mutmut_1": "sql = 'SELEC'", "m.x_f__mutmut_2": "x = 1"}
    )
    assert stale == {
        "m.x_f__mutmut_1": "its triage was written for `sql = 'SELECT'`, "
        "this mutant puts in `sql = 'SELEC'`",
        "m.x_f__mutmut_2": "its triage records no mutated code",
    }


def test_every_triage_entry_records_the_code_it_was_written_for() -> None:
    from stateful_tests import mutation_triage as triage

    assert [n for n, t in triage.reviewed().items() if not t.mutated] == []


def test_only_a_failed_test_counts_as_a_kill() -> None:
    from stateful_tests import mutation_verdicts as verdicts

    # mutmut stops a mutant on a CPU limit drawn from the tests' first run; a
    # slow room passes it with a mutant every test lets through, so a
    # "timeout" is rechecked like a survivor, never counted as a kill.
    statuses = {
        "a": "killed",
        "b": "caught by type check",
        "c": "survived",
        "d": "no tests",
        "e": "timeout",
        "f": "suspicious",
        "g": "segfault",
        "h": "not checked",
    }
    assert verdicts.unconfirmed(statuses) == ["c", "d", "e", "f", "g", "h"]
    assert verdicts.failed_a_test("...\nFAILED tests/x.py::test_y - AssertionError\n")
    assert verdicts.failed_a_test("ERROR tests/x.py::test_y - fixture broke\n")
    assert not verdicts.failed_a_test("12 passed in 3.0s\n")
    assert not verdicts.failed_a_test("  FAILED is only a word in a log line\n")


def test_a_recheck_that_hangs_is_stopped_and_is_not_a_kill(tmp_path: Path) -> None:
    import sys

    from stateful_tests import mutation_verdicts as verdicts

    # The hang is in a child of pytest's process, as in an xdist worker: the
    # whole session is stopped, or reading its output would wait for good.
    token = f"recheck-hang-{os.getpid()}"
    spins = (
        "import subprocess, sys, time;"
        "print({before!r}, flush=True);"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {token!r}]);"
        "time.sleep(600)"
    )

    def run(before: str, limit: float = 1.0) -> verdicts.Recheck:
        command = [sys.executable, "-c", spins.format(before=before)]
        return verdicts.run_until(command, cwd=tmp_path, env=dict(os.environ), limit=limit)

    assert run("..") == verdicts.Recheck(killed=False, hung=True)
    assert run("FAILED tests/x.py::test_y - AssertionError") == verdicts.Recheck(killed=True)
    passes = [sys.executable, "-c", "print('3 passed')"]
    assert verdicts.run_until(passes, tmp_path, dict(os.environ), 60.0) == verdicts.Recheck(False)
    fails = [sys.executable, "-c", "print('FAILED tests/x.py::t - E')"]
    assert verdicts.run_until(fails, tmp_path, dict(os.environ), 60.0) == verdicts.Recheck(True)
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if token.encode() in _read(p)]
    assert left == []


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended while the test looked
        return b""


def test_a_stopped_run_is_scored_on_what_ran_and_says_what_did_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import sys

    from stateful_tests import mutation_score as score

    # mutmut as a stopped run leaves it: some verdicts, some never run.
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "mutmut").write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "if sys.argv[1] == 'results':\n"
        "    print('    m.x_f__mutmut_1: killed')\n"
        "    print('    m.x_f__mutmut_2: killed')\n"
        "    print('    m.x_f__mutmut_3: survived')\n"
        "    print('    m.x_g__mutmut_1: not checked')\n"
    )
    (bin_ / "mutmut").chmod(0o700)
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}
    args = argparse.Namespace(modules=["m.py"], no_recheck=True, recheck_limit=1.0)
    assert score.score(tmp_path, env, args, []) == 1
    out = capsys.readouterr().out
    assert "NOT RUN: 1 mutants" in out
    assert "mutants: 3, killed: 2" in out
    assert "raw score: 66.67%" in out
    assert "SURVIVED    m.x_f__mutmut_3" in out
    assert "m.x_g__mutmut_1" not in out
