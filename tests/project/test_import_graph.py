"""No import cycle among the library's modules (imports inside functions included).

A cycle is how a module that should stand alone (the CLI's loaders, a
ledger) starts to depend on everything; once one exists, the next rule that
lands has nowhere clean to go.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def modules(package: str) -> dict[str, Path]:
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules ``path`` imports, anywhere but under ``if TYPE_CHECKING:``."""
    targets: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while stack:
        node = stack.pop()
        if is_type_checking_block(node):
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for candidate in (node.module, *(f"{node.module}.{a.name}" for a in node.names)):
                if candidate in known:
                    targets.add(candidate)
        elif isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names if alias.name in known)
        stack.extend(ast.iter_child_nodes(node))
    return targets


def cycles(package: str) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    known = modules(package)
    graph = {name: imports_of(path, known) - {name} for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", ["dataoad", "models", "stateful_tests"])
def test_no_import_cycle(package: str) -> None:
    assert cycles(package) == []


def test_the_check_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "loop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from loop.b import x\n")
    (package / "b.py").write_text("def f():\n    from loop.a import y\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert cycles("loop") == [["loop.a", "loop.b"]]


def outside_imports(package: str) -> dict[str, set[str]]:
    """Per module of ``package``: the top-level names of the repository's packages it imports."""
    known: dict[str, Path] = {}
    for other in ("dataoad", "models", "stateful_tests", "tests", "suite_support"):
        known.update(modules(other))
    known["conftest"] = ROOT / "conftest.py"
    found = {}
    for name, path in modules(package).items():
        found[name] = set(imports_of(path, known))
    return found


def test_the_library_imports_nothing_of_the_verification_tree() -> None:
    for name, targets in outside_imports("dataoad").items():
        bad = {
            t
            for t in targets
            if t.split(".")[0] in ("models", "stateful_tests", "tests", "suite_support")
        }
        assert not bad, f"{name} imports {sorted(bad)}"


def test_the_model_imports_neither_the_state_machines_nor_the_tests() -> None:
    for name, targets in outside_imports("models").items():
        bad = {
            t
            for t in targets
            if t.split(".")[0] in ("stateful_tests", "tests", "suite_support", "conftest")
        }
        assert not bad, f"{name} imports {sorted(bad)}"


def test_the_shared_support_imports_neither_tests_nor_machines() -> None:
    """``suite_support`` serves both trees, so it depends on neither."""
    for name, targets in outside_imports("suite_support").items():
        bad = {t for t in targets if t.split(".")[0] in ("stateful_tests", "tests", "conftest")}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_machines_and_harness_import_no_test_module_or_conftest() -> None:
    for name, targets in outside_imports("stateful_tests").items():
        if name.split(".")[-1].startswith("test_") or name.endswith("conftest"):
            continue  # test modules may import anything below them
        bad = {
            t
            for t in targets
            if t.split(".")[0] in ("tests", "conftest")
            or t.split(".")[-1].startswith("test_")
            or t.endswith("conftest")
        }
        assert not bad, f"{name} imports {sorted(bad)}"


def test_the_one_way_check_sees_a_test_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for package in ("dataoad", "models", "stateful_tests", "tests"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "stateful_tests" / "test_m.py").write_text("")
    (tmp_path / "stateful_tests" / "harness.py").write_text("import stateful_tests.test_m\n")
    (tmp_path / "conftest.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="test_m"):
        test_machines_and_harness_import_no_test_module_or_conftest()


def core_layer_violations() -> dict[str, set[str]]:
    """Core modules (``dataoad/_*.py`` but the CLI's) that import a backend, the console or
    an integration: the core sees ledgers only through the ``Ledger`` protocol."""
    known = modules("dataoad")
    outer = ("dataoad.ledgers", "dataoad._console", "dataoad.integrations", "dataoad.testing")
    found = {}
    for name, path in known.items():
        leaf = name.split(".")[-1]
        if name.count(".") != 1 or not leaf.startswith("_") or leaf.startswith("_cli"):
            continue  # a backend, a front end, the CLI, or the package's surface
        bad = {t for t in imports_of(path, known) if t.startswith(outer)}
        if bad:
            found[name] = bad
    return found


def test_the_core_imports_no_backend_internals() -> None:
    assert core_layer_violations() == {}


def test_the_layering_check_sees_a_backend_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dataoad" / "ledgers").mkdir(parents=True)
    (tmp_path / "dataoad" / "__init__.py").write_text("")
    (tmp_path / "dataoad" / "ledgers" / "__init__.py").write_text("")
    (tmp_path / "dataoad" / "ledgers" / "_codec.py").write_text("")
    (tmp_path / "dataoad" / "_runner.py").write_text("from dataoad.ledgers._codec import x\n")
    (tmp_path / "dataoad" / "_cli_open.py").write_text("from dataoad.ledgers._codec import x\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert core_layer_violations() == {"dataoad._runner": {"dataoad.ledgers._codec"}}
