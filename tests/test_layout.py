"""Import rules of the layout, between every top-level package: `simulation/` -> `deploy/` -> `strategies/`,
`clients/` -> `fedapp/`, one way. clients/ and strategies/ never import each other; fedapp/ imports none of
them; deploy/ never imports simulation/ (what both need lives in fedapp/launch/)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {  # package -> the other top-level packages it may import
    "simulation": {"deploy", "strategies", "clients", "fedapp"},
    "deploy": {"strategies", "clients", "fedapp"},
    "strategies": {"fedapp"},
    "clients": {"fedapp"},
    "fedapp": set(),
}
FORBIDDEN = {package: set(ALLOWED) - allowed - {package} for package, allowed in ALLOWED.items()}


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


def test_the_allowed_directions_form_no_circle() -> None:
    """Each package may import only packages below it: a topological order of ALLOWED exists."""
    remaining = dict(ALLOWED)
    while remaining:
        leaves = [package for package, allowed in remaining.items() if not allowed & set(remaining)]
        assert leaves, f"the allowed imports of {sorted(remaining)} go round in a circle"
        for package in leaves:
            del remaining[package]


def test_every_top_level_package_is_ruled() -> None:
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == set(ALLOWED), f"top-level packages without import rules: {packages - set(ALLOWED)}"


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


def test_the_client_app_imports_no_scikit_learn_until_a_message_needs_it() -> None:
    """A deployment starts one ClientApp process per message: scikit-learn's import (~1 s, scipy.stats
    with it) is paid only by a message that clusters (`fedapp.maths.clustering.kmeans` imports it)."""
    probe = "import sys, fedapp.app.client_app; print(sorted(m for m in sys.modules if m[:7] == 'sklearn'))"
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"
