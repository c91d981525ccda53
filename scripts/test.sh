#!/usr/bin/env bash
# Fresh machine -> the test suite: set up .venv, lint, run every test (end-to-end Flower simulation and
# loopback deployment included). Tests that need ../shared/data skip cleanly when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q --durations=15 "$@"
