"""CeFMC paper Table V layout: seconds per method and dataset, maths only and end to end in simulation.

    python -m simulation.papers.cefmc.bench_time [--datasets hw bdgp drybean] [--repeats 3] [--no-flwr]

Maths only: `simulation.papers.cefmc.reference.run_reference` (every client and server step in one process, no
Flower), median of `--repeats`, one BLAS thread. End to end: one `flwr run` Ray simulation per dataset
(`python -m simulation run`, one SuperNode per view), which adds Flower's start-up (~10 s) and round
overhead (~0.1 s per round). Needs ../shared/data (or $FEDAPP_DATA_DIR).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from threadpoolctl import threadpool_limits

from fedapp.datasets import load_dataset, resolve_data_dir
from fedapp.launch.resolve import build_overrides
from simulation.papers.cefmc.reference import run_reference
from simulation.runner import execute

METHODS = ("fedcmv", "fedfcmv", "cefmc", "cefmc-h")
FUZZIFIER = 2.0
# Table V of the paper (seconds; FedCMv, FedFCMv, CeFMC) for the datasets we have
PAPER = {"hw": (75.0, 9.9, 0.2), "bdgp": (24.2, 13.3, 1.4), "drybean": (24.9, 10.8, 1.6)}


def maths_seconds(dataset: str, method: str, repeats: int) -> tuple[float, int]:
    data = load_dataset(dataset, resolve_data_dir())
    times, rounds = [], 0
    for seed in range(repeats):
        started = time.perf_counter()
        run = run_reference(method, data.views, data.n_classes, fuzzifier=FUZZIFIER, seed=seed)
        times.append(time.perf_counter() - started)
        rounds = run.n_rounds
    return statistics.median(times), rounds


def flwr_seconds(dataset: str, method: str) -> tuple[float, float]:
    """(wall seconds of the whole `flwr run`, the strategy's own wall_seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        overrides = build_overrides({"method": method, "dataset": dataset, "num-rounds": 100}, Path(tmp))
        started = time.perf_counter()
        summary = execute(overrides, "flwr", quiet=True, overwrite=True)
        return time.perf_counter() - started, float(summary["wall_seconds"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", nargs="+", default=["hw", "bdgp", "drybean"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-flwr", action="store_true", help="skip the end-to-end Flower simulation timing")
    args = parser.parse_args(argv)
    print(
        "| dataset | "
        + " | ".join(f"{m} maths s (rounds)" for m in METHODS)
        + " | CeFMC flwr run s (strategy s) | paper FedCMv / FedFCMv / CeFMC s |"
    )
    print("|---" * (len(METHODS) + 3) + "|")
    for dataset in args.datasets:
        with threadpool_limits(limits=1):
            cells = [maths_seconds(dataset, method, args.repeats) for method in METHODS]
        flwr_cell = "—"
        if not args.no_flwr:
            total, strategy = flwr_seconds(dataset, "cefmc")
            flwr_cell = f"{total:.1f} ({strategy:.1f})"
        paper = " / ".join(f"{value:g}" for value in PAPER.get(dataset, ()))
        print(
            f"| {dataset} | "
            + " | ".join(f"{s:.2f} ({r})" for s, r in cells)
            + f" | {flwr_cell} | {paper} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
