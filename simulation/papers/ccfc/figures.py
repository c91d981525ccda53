"""CCFC's MNIST figures and the ablation table from finished sweeps (see simulation/papers/ccfc/*.toml).

# Fig. 6 / Fig. 7: NMI and kappa against a swept run-config key, one line per p
python -m simulation.papers.ccfc.figures sweep results/ccfc-lambda --key ccfc.lambda --log-x \
        --out docs/ccfc-lambda.png
python -m simulation.papers.ccfc.figures sweep results/ccfc-dropout --key dropout-rate \
        --out docs/ccfc-dropout.png
# points measured earlier whose run folders are gone: a CSV of them (p, the key, seed, nmi, kappa, acc)
python -m simulation.papers.ccfc.figures sweep results/ccfc-lambda \
        --points simulation/papers/ccfc/lambda_points.csv --key ccfc.lambda --log-x --out docs/ccfc-lambda.png
# Table 4: kappa per client and overall, one column per run label
python -m simulation experiment simulation/papers/ccfc/table4.toml --out results/ccfc-table4 --resume
python -m simulation.papers.ccfc.figures table4 results/ccfc-table4
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from fedapp.report.records import save_figure

PAPER_TABLE4 = {  # kappa of clients 1..10 in the paper's Table 4 (p = 0)
    "SCFC standalone": [0.1286, 0.1774, 0.1685, 0.2751, 0.2134, 0.1862, 0.1876, 0.3407, 0.2810, 0.1940],
    "CCFC standalone": [0.4255, 0.2036, 0.0517, 0.1847, 0.0926, 0.1892, 0.1681, 0.3741, 0.2936, 0.2727],
    "SCFC FedAvg": [0.8243, 0.8297, 0.8273, 0.8239, 0.8179, 0.8201, 0.8241, 0.8330, 0.8190, 0.8214],
    "CCFC FedAvg": [0.8749, 0.8787, 0.8783, 0.8714, 0.8689, 0.8696, 0.8722, 0.8750, 0.8687, 0.8686],
    "SCFC": [0.8970, 0.9046, 0.9027, 0.8987, 0.8976, 0.8987, 0.8995, 0.9030, 0.8983, 0.9000],
    "CCFC": [0.9605, 0.9643, 0.9611, 0.9617, 0.9609, 0.9625, 0.9624, 0.9611, 0.9616, 0.9630],
}


def load_results(root: Path) -> dict[str, list[dict[str, Any]]]:
    """label -> the summaries of its seeds, as `simulation experiment` wrote them."""
    return json.loads((root / "results.json").read_text())


def load_points(path: Path, key: str) -> dict[str, list[dict[str, Any]]]:
    """Summaries rebuilt from a CSV of measured points (columns p, `key`, seed, nmi, kappa, acc; values in
    percent), for runs whose folders are gone; one label per row, in `load_results`' shape."""
    points: dict[str, list[dict[str, Any]]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(line for line in handle if not line.startswith("#")):
            try:
                config = {"p": float(row["p"]), key: float(row[key])}
                metrics = {m: float(row[m]) / 100 for m in ("nmi", "kappa", "acc")}
                seed = int(row["seed"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}: row {row} lacks or garbles {exc}") from None
            points[f"{path.name}:{len(points)}"] = [{"config": config, "metrics": metrics, "seed": seed}]
    return points


def merge_points(
    results: dict[str, list[dict[str, Any]]], points: dict[str, list[dict[str, Any]]], key: str
) -> dict[str, list[dict[str, Any]]]:
    """`results` plus the points of runs it lacks (same p, `key` value and seed: the run folder wins)."""

    def identity(summary: dict[str, Any]) -> tuple[float, float, int]:
        config = summary["config"]
        return float(config["p"]), float(config[key]), int(summary.get("seed", config.get("seed", 0)))

    have = {identity(s) for summaries in results.values() for s in summaries}
    extra = {label: rows for label, rows in points.items() if identity(rows[0]) not in have}
    return {**results, **extra}


def sweep_series(
    results: dict[str, list[dict[str, Any]]], key: str, metric: str
) -> dict[float, list[tuple[float, float, float]]]:
    """p -> sorted (x, mean, std) of `metric` (percent) over seeds, x = the run's value of `key`."""
    points: dict[float, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for summaries in results.values():
        for summary in summaries:
            config = summary["config"]
            points[float(config["p"])][float(config[key])].append(100 * summary["metrics"][metric])
    return {
        p: sorted(
            (x, statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0) for x, v in by_x.items()
        )
        for p, by_x in sorted(points.items())
    }


def sweep_figure(root: Path, key: str, out: Path, *, log_x: bool = False, points: Path | None = None) -> None:
    """NMI and kappa against `key`, one line per p (the paper's Fig. 6 / Fig. 7 layout)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = load_results(root) if (root / "results.json").is_file() or points is None else {}
    if points is not None:
        results = merge_points(results, load_points(points, key), key)
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.0))
    for ax, metric in zip(axes, ("nmi", "kappa"), strict=True):
        for p, series in sweep_series(results, key, metric).items():
            xs, means, stds = zip(*series, strict=True)
            ax.errorbar(xs, means, yerr=stds, marker="o", ms=3, capsize=2, label=f"p = {p:g}")
        ax.set_xlabel(key)
        ax.set_ylabel(f"{metric.upper()} (%)")
        if log_x:
            ax.set_xscale("symlog", linthresh=1e-4)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    save_figure(fig, out, dpi=90)


def table4(root: Path) -> str:
    """Markdown: kappa of each client (its own samples, its own best cluster-class matching) and of the
    whole federation (summed tables), one column per run label, the paper's value in brackets."""
    results = load_results(root)
    labels = list(results)
    lines = ["| client | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    first = results[labels[0]][0]["client_metrics"]
    for client in sorted(first, key=int):
        cells = []
        for label in labels:
            ours = statistics.fmean(100 * s["client_metrics"][client]["kappa"] for s in results[label])
            paper = PAPER_TABLE4.get(label)
            cells.append(f"{ours:.2f}" + (f" ({100 * paper[int(client)]:.2f})" if paper else ""))
        lines.append(f"| {int(client) + 1} | " + " | ".join(cells) + " |")
    overall = [
        f"{statistics.fmean(100 * s['metrics']['kappa'] for s in results[label]):.2f}" for label in labels
    ]
    lines.append("| all (summed tables) | " + " | ".join(overall) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sweep = sub.add_parser("sweep", help="NMI / kappa against a swept key, one line per p")
    sweep.add_argument("root", type=Path)
    sweep.add_argument("--key", required=True, help="run-config key on the x axis, e.g. ccfc.lambda")
    sweep.add_argument("--out", type=Path, required=True)
    sweep.add_argument("--log-x", action="store_true")
    sweep.add_argument("--points", type=Path, help="CSV of earlier measured points (see load_points)")
    table = sub.add_parser("table4", help="kappa per client and overall (paper Table 4)")
    table.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    if args.command == "sweep":
        try:  # a missing or garbled results.json / points CSV: one line, no traceback
            sweep_figure(args.root, args.key, args.out, log_x=args.log_x, points=args.points)
        except (OSError, ValueError, KeyError) as exc:
            parser.error(str(exc))
        print(f"wrote {args.out}")
    else:
        print(table4(args.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
