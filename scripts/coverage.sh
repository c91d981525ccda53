#!/usr/bin/env bash
# Line and branch coverage of the test suite (coverage.py; settings in pyproject.toml [tool.coverage]),
# Flower's and Ray's subprocesses included: `bash scripts/coverage.sh` (the default suite) or
# `bash scripts/coverage.sh --all` (with the `slow` tests). Prints the report's total line; the data stays
# in .coverage-data/ (`.venv/bin/coverage report -m` for the lines missed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
rm -rf .coverage-data && mkdir .coverage-data
MARKS="not install and not slow"
if [ "${1:-}" = "--all" ]; then
  MARKS="not install"
  shift
fi
status=0  # a failing test still gets its coverage reported; the script then exits with pytest's code
.venv/bin/coverage run -m pytest -q -p no:randomly -n "${FEDAPP_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder -m "$MARKS" "$@" \
  || status=$?
.venv/bin/coverage combine -q .coverage-data
.venv/bin/coverage report --format=total >/dev/null  # fails when nothing was measured
.venv/bin/coverage json -q -o .coverage-data/coverage.json
.venv/bin/python - <<'PY'
import json

totals = json.load(open(".coverage-data/coverage.json"))["totals"]
print(
    f"lines {totals['covered_lines']}/{totals['num_statements']} ({totals['percent_statements_covered']:.2f} %), "
    f"branches {totals['covered_branches']}/{totals['num_branches']} ({totals['percent_branches_covered']:.2f} %), "
    f"total {totals['percent_covered']:.2f} %"
)
PY
exit "$status"
