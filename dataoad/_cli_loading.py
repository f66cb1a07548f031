"""Loading the user code a command line names: a file, or ``module:attribute``.

Shared by ``dataoad test``, ``dataoad check`` and the operator commands, so
that none of them imports another.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["UsageProblem", "import_attribute", "importable_from", "load_module"]


class UsageProblem(Exception):
    """A one-line reason the command cannot run; exit status 2."""


def _import_roots(folder: Path) -> list[str]:
    """Where a suite file's own imports resolve: its folder, and above its package.

    Like pytest's rootdir insertion: a file inside a package (folders with
    ``__init__.py``) can import that package by name.
    """
    roots = [str(folder)]
    top = folder
    while (top / "__init__.py").exists() and top.parent != top:
        top = top.parent
    if top != folder:
        roots.append(str(top))
    return roots


@contextlib.contextmanager
def importable_from(folder: Path) -> Iterator[None]:
    """Within the block, a file in ``folder`` can import what sits beside it (and its package)."""
    # Scenario files may import helpers that sit beside them.
    roots = _import_roots(folder)
    for root in reversed(roots):
        sys.path.insert(0, root)
    try:
        yield
    finally:
        for root in roots:
            with contextlib.suppress(ValueError):
                sys.path.remove(root)


def load_module(path: Path) -> Any:
    """Import the Python file at ``path`` as a fresh module (its folder importable)."""
    if not path.is_file():
        raise UsageProblem(f"{path}: no such file")
    if path.suffix != ".py":
        raise UsageProblem(f"{path}: not a Python file")
    name = f"_dataoad_suite_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageProblem(f"{path}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with importable_from(path.parent.resolve()):
            spec.loader.exec_module(module)
    except Exception as exc:
        raise UsageProblem(f"{path}: failed to import: {type(exc).__name__}: {exc}") from exc
    except SystemExit as exc:
        # An unguarded ``sys.exit(main())``: it would end this command with
        # the module's own status, a pass (0) or a false violation (1).
        raise UsageProblem(
            f"{path}: called sys.exit({exc.code!r}) while being imported (guard it with "
            "if __name__ == '__main__':)"
        ) from None
    return module


def import_attribute(spec: str) -> Any:
    """The object ``module:attribute`` names, importing from the working folder too.

    Raises ValueError when ``spec`` is not of that form, and LookupError
    (one line) when the module cannot be imported or lacks the attribute.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"must look like module:attribute, not {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise LookupError(f"cannot import {module_name}: {type(exc).__name__}: {exc}") from exc
    except SystemExit as exc:
        raise LookupError(
            f"cannot import {module_name}: it called sys.exit({exc.code!r}) while being imported"
        ) from None
    finally:
        sys.path.remove(os.getcwd())
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise LookupError(f"{module_name} has no attribute {attribute!r}") from None
