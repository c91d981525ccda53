#!/usr/bin/env bash
# Fresh machine -> the test suite: set up .venv, lint, run every test (end-to-end Flower simulation and
# loopback deployment included). Tests that need ../shared/data skip cleanly when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
# two workers (pytest-xdist), one test file each at a time: every run has its own ports, FLWR_HOME and
# folders; FEDAPP_TEST_WORKERS=0 runs them in this process, one after another
# --all adds the `slow` tests (an end-to-end path re-proved with another method or setting)
MARKS="not install and not slow"
if [ "${1:-}" = "--all" ]; then
  MARKS="not install"
  shift
fi
.venv/bin/python -m pytest -q -n "${FEDAPP_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=15 -m "$MARKS" "$@"
