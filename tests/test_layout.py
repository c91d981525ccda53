"""Import rules of the layout: clients/ and strategies/ never import each other; fedapp/ imports neither."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"fedapp": {"clients", "strategies"}, "strategies": {"clients"}, "clients": {"strategies"}}


def imported_packages(source: str) -> set[str]:
    """Top-level packages a module imports anywhere in it (function-local imports included).

    Relative imports stay inside the module's own package, so they cannot break the rules.
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_forbidden_imports(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path.read_text()) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    offenders = {name: bad for name, bad in offenders.items() if bad}
    assert not offenders, f"{package}/ must not import {sorted(FORBIDDEN[package])}: {offenders}"


def test_the_walker_sees_function_local_and_dotted_imports() -> None:
    """The check above would be worthless if it missed an import hidden in a function."""
    source = "def f():\n    from clients import base as b\n    import strategies.kfed\n"
    assert imported_packages(source) == {"clients", "strategies"}


def test_registered_classes_live_in_their_folders() -> None:
    from fedapp.methods import METHODS

    for spec in METHODS.values():
        if spec.federated:
            assert spec.strategy is not None and spec.strategy.startswith("strategies.")
            assert spec.client is not None and spec.client.startswith("clients.")
