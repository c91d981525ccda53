#!/usr/bin/env bash
# Fresh machine -> the main job: set up .venv, run federated fuzzy c-means on the embedded `digits`
# dataset with 10 clients through Flower's simulation engine (per-round progress), then compare
# k-FED, FFCM and centralized k-means on the same data. No downloads, no ../shared needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m simulation run --method ffcm --dataset digits --clients 10 --rounds 15 \
  --out results/quickstart/ffcm-flwr
.venv/bin/python -m simulation experiment simulation/experiments/quickstart.toml --out results/quickstart/table
