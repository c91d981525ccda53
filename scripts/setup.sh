#!/usr/bin/env bash
# Create or update the virtual environment at .venv/ and install fedapp with its dependencies.
# Idempotent: a second run only checks what is installed.
set -euo pipefail
# Exact versions from constraints.txt (reproducible numerics); FEDAPP_CONSTRAINTS= (empty) skips them, a
# path of your own (relative to where you call this script) replaces them. Checked before anything is built.
PIN=()
if [ -n "${FEDAPP_CONSTRAINTS-x}" ]; then
  CONSTRAINTS=${FEDAPP_CONSTRAINTS:-"$(dirname "$0")/../constraints.txt"}
  [ -f "$CONSTRAINTS" ] || { echo "[setup] constraints file '$CONSTRAINTS' not found" >&2; exit 2; }
  PIN=(-c "$(cd "$(dirname "$CONSTRAINTS")" && pwd)/$(basename "$CONSTRAINTS")")
fi
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# uv installs the same pinned set several times faster (parallel, hard links from its cache: ~30 s instead
# of ~5 min for torch's CUDA wheels); pip does it where uv cannot be had (FEDAPP_PIP=1 asks for pip)
INSTALL=("${PIP[@]}")
if [ -z "${FEDAPP_PIP:-}" ] && { [ -x .venv/bin/uv ] || "${PIP[@]}" "${PIN[@]}" uv 2>/dev/null; }; then
  INSTALL=(.venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python)
fi
# torch first and pinned: flwr's and sentence-transformers' requirements would otherwise pull a newer build.
"${INSTALL[@]}" "${PIN[@]}" "torch==2.14.1" "torchvision==0.29.1"
"${INSTALL[@]}" "${PIN[@]}" -e ".[torch,dev,track]"
# Our packages compiled as well (uv compiles only what it installs): where PYTHONDONTWRITEBYTECODE is set, as
# on this CI machine, every process would otherwise compile them again, and a deployment starts one per message
.venv/bin/python -m compileall -q -j 0 fedapp clients strategies simulation deploy >/dev/null
# CI: Debian's Chromium for the report pages' browser test (tests/test_report_browser.py; it skips without)
if [ "${CI:-}" = true ] && ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
    || echo "[setup] chromium not installed: the browser test will skip" >&2
fi
echo "[setup] ready: $(.venv/bin/python -c 'import flwr, torch, sklearn; print(f"flwr {flwr.__version__}, torch {torch.__version__}, scikit-learn {sklearn.__version__}")')"
