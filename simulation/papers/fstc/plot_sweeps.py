"""FSTC paper Fig. 3 and Fig. 4 from experiment results: ACC / NMI against λ, the client count m and ρ.

    python -m simulation.papers.fstc.plot_sweeps --results results/fstc-lambda/results.json --x fstc.lambda \
        --log-x --out docs/fstc-lambda.png
    python -m simulation.papers.fstc.plot_sweeps --results results/fstc-clients/results.json --x num-clients \
        --out docs/fstc-clients.png

Each run label of the experiment is one point; runs are grouped into lines by their method. `--x` names
the run-config key on the x axis (`rho` reads the size ratio a:b of partition size-ratio as ρ = 1..4 for
6:4 .. 9:1, and IID as ρ = 0). A method with a single point (e.g. FSTC-STC in the λ sweep, which has no
λ) is drawn as a dashed reference line.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from fedapp.report.records import save_figure

RHO = {"6:4": 1, "7:3": 2, "8:2": 3, "9:1": 4}


def x_value(config: dict[str, Any], key: str) -> float:
    if key == "rho":
        return 0.0 if config["partition"] == "iid" else float(RHO[config["ratio"]])
    return float(config[key])


def series(
    results: dict[str, list[dict[str, Any]]], key: str, metric: str
) -> dict[str, list[tuple[float, float, float]]]:
    """method -> sorted (x, mean, std) of `metric` in percent over each run's seeds."""
    lines: dict[str, list[tuple[float, float, float]]] = {}
    for summaries in results.values():
        values = [100 * s["metrics"][metric] for s in summaries]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        point = (x_value(summaries[0]["config"], key), statistics.fmean(values), std)
        lines.setdefault(summaries[0]["method"].upper(), []).append(point)
    return {method: sorted(points) for method, points in lines.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="an experiment's results.json")
    parser.add_argument("--x", required=True, help="run-config key on the x axis, or 'rho'")
    parser.add_argument("--log-x", action="store_true")
    parser.add_argument("--title", default="")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(args.results.read_text())
    figure, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for axis, metric in zip(axes, ("acc", "nmi"), strict=True):
        for index, (method, points) in enumerate(series(results, args.x, metric).items()):
            xs, means, stds = zip(*points, strict=True)
            colour = f"C{index}"  # the same method has the same colour in both panels
            if len(points) == 1:  # a row that does not vary with x (an ablation): a reference line
                axis.axhline(means[0], linestyle="--", linewidth=1, color=colour, label=method)
            else:
                axis.errorbar(xs, means, yerr=stds, marker="o", capsize=3, color=colour, label=method)
        axis.set_xlabel("ρ" if args.x == "rho" else args.x)
        axis.set_ylabel(f"{metric.upper()} (%)")
        if args.log_x:
            axis.set_xscale("log")
        axis.grid(alpha=0.3)
    axes[0].legend()
    if args.title:
        figure.suptitle(args.title)
    save_figure(figure, args.out, dpi=80)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
