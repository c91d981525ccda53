"""How well k = 0 chooses k for the vertical methods (docs/model-selection.md): every party runs the
selection on its own view of all records (`fedapp.maths.selection.select_k` over its rows alone), the run
takes the rounded mean of their choices (`view_consensus`); then CeFMC runs at the chosen and at the
true k and the table compares their NMI, beside the two medians' choices (the rules not taken).
Labels are used only here, to score the choice.

    .venv/bin/python -m simulation.bench.vertical_selection [NAME ...]    # hw bdgp digits-mv
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from fedapp.datasets import load_dataset
from fedapp.datasets.preprocessing import scale_view
from fedapp.launch.resolve import build_overrides
from fedapp.maths.selection import RULE, select_k, view_consensus
from simulation.runner import execute

BENCHMARKS = ("hw", "bdgp", "digits-mv")
FLOOR = 5


def cefmc_nmi(name: str, k: int, views: int, seed: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        overrides = {"method": "cefmc", "dataset": name, "num-clients": views, "k": k, "seed": seed}
        summary = execute(build_overrides(overrides, Path(out)), engine="inprocess", quiet=True)
    return 100 * float(summary["metrics"]["nmi"])


def measure(name: str, seed: int = 0) -> str:
    """One markdown row: true k, each view's choice, CeFMC's NMI at each consensus rule's k and at the
    true k, and the selection's seconds."""
    data = load_dataset(name)
    assert data.views is not None and data.y is not None
    true_k = len(set(data.y.tolist()))
    started = time.perf_counter()
    selections = [select_k([scale_view(view, "none")], 2, 30, seed, FLOOR, RULE)[0] for view in data.views]
    seconds = time.perf_counter() - started
    choices = [selection.k for selection in selections]
    weak = [selection.confidence.get("verdict") != "strong" for selection in selections]
    ordered = sorted(choices)
    rules = {
        "mean": view_consensus(choices),
        "lower median": ordered[(len(ordered) - 1) // 2],
        "upper median": ordered[len(ordered) // 2],
    }
    nmi = {k: cefmc_nmi(name, k, len(data.views), seed) for k in {*rules.values(), true_k}}
    cells = " | ".join(f"{k} ({nmi[k]:.1f}, {nmi[k] - nmi[true_k]:+.1f})" for k in rules.values())
    views = ", ".join(f"{k}{' (weak)' if w else ''}" for k, w in zip(choices, weak, strict=True))
    return f"| {name} | {true_k} | {views} | {cells} | {nmi[true_k]:.1f} | {seconds:.1f} |"


def main(names: list[str]) -> None:
    print(
        f"| benchmark | true k | each view's choice ({RULE}) | rounded mean: k (CeFMC NMI, miss) "
        "| lower median | upper median | NMI at true k | s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names or BENCHMARKS:
        print(measure(name), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
