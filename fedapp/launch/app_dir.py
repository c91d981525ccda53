"""The Flower app folder that `flwr run` packs into a FAB (the app bundle a SuperLink runs).

Always a folder made beside the run's other private files: the app's packages, copied from where they are
imported (the checkout for the editable install `scripts/setup.sh` makes, site-packages for `pip install .`
or a container image), and a pyproject.toml written from the code, whose `[tool.flwr.app.config]` keys and
defaults are the ones the code declares (`tests/test_dependencies.py` holds it equal to the project's).
Not the checkout itself: Flower walks every file under the folder it packs before filtering, and a
checkout holds the venv and run outputs (62,705 files in one: 4.7 s of every run, against milliseconds).
"""

from __future__ import annotations

import importlib
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import tomli_w

from fedapp.config.run import default_run_config

APP_PACKAGES = ("fedapp", "strategies", "clients")  # what the ServerApp and the ClientApp import
COMPONENTS = {"serverapp": "fedapp.app.server_app:app", "clientapp": "fedapp.app.client_app:app"}


def flower_app_dir(work_dir: Path) -> Path:
    """`work_dir`/flower-app: the app's packages (no bytecode) and the pyproject.toml Flower reads."""
    app = work_dir / "flower-app"
    if app.exists():
        shutil.rmtree(app)
    for package in APP_PACKAGES:
        source = Path(importlib.import_module(package).__file__ or "").parent
        shutil.copytree(source, app / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (app / "pyproject.toml").write_text(tomli_w.dumps(app_project()))
    return app


def app_project() -> dict[str, Any]:
    """pyproject.toml's content as Flower reads it: the project's name and version, the app's publisher,
    components and every run-config key with its default (dotted keys nested, as the tables write them)."""
    config: dict[str, Any] = {}
    for key, value in default_run_config().items():
        *tables, name = key.split(".")
        table = config
        for part in tables:
            table = table.setdefault(part, {})
        table[name] = value
    try:
        fedapp_version = version("fedapp")
    except PackageNotFoundError:  # run from a source tree that was never installed
        fedapp_version = "0.0.0"
    return {
        "project": {
            "name": "fedapp",
            "version": fedapp_version,
            "description": "Federated clustering and topic modelling with Flower",
            "license": "Apache-2.0",
            "dependencies": [f"flwr[simulation]=={version('flwr')}"],
        },
        "tool": {"flwr": {"app": {"publisher": "fedapp", "components": COMPONENTS, "config": config}}},
    }
