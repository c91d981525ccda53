"""CeFMC's lambda = beta grid over 2^-10 ... 2^10 (paper Sec. V-G), maths only.

    python -m simulation.papers.cefmc.lambda_grid [--datasets hw bdgp drybean] [--seeds 0 1 2] [--step 2]

For every dataset and exponent: ACC / NMI (mean over seeds) and the share of samples whose consensus label
moved away from the k-means initialisation y^(0). Prints one markdown table per dataset and the best
exponent. Uses the in-process reference driver (same maths as the Flower clients/strategy).
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from threadpoolctl import threadpool_limits

from fedapp.datasets import load_dataset, resolve_data_dir
from fedapp.metrics.contingency import clustering_metrics, contingency_table
from simulation.papers.cefmc.reference import run_reference


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", nargs="+", default=["hw", "bdgp", "drybean"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--step", type=int, default=2, help="exponent step from -10 to 10")
    parser.add_argument("--scaling", default="none")
    args = parser.parse_args(argv)
    exponents = list(range(-10, 11, args.step))
    for dataset in args.datasets:
        data = load_dataset(dataset, resolve_data_dir())
        print(f"\n### {dataset} (scaling={args.scaling}, seeds {args.seeds})\n")
        print("| lambda = beta | ACC | NMI | labels moved from y(0) | rounds |")
        print("|---|---|---|---|---|")
        best = None
        for exponent in exponents:
            accs, nmis, moved, rounds = [], [], [], []
            for seed in args.seeds:
                with threadpool_limits(limits=1):
                    run = run_reference(
                        "cefmc",
                        data.views,
                        data.n_classes,
                        scaling=args.scaling,
                        lam=2.0**exponent,
                        seed=seed,
                    )
                metrics = clustering_metrics(
                    contingency_table(run.labels, data.y, data.n_classes, data.n_classes)
                )
                accs.append(100 * metrics["acc"])
                nmis.append(100 * metrics["nmi"])
                moved.append(100 * float(np.mean(run.labels != run.initial_labels)))
                rounds.append(run.n_rounds)
            acc = statistics.fmean(accs)
            print(
                f"| 2^{exponent} | {acc:.2f} | {statistics.fmean(nmis):.2f} "
                f"| {statistics.fmean(moved):.2f} % "
                f"| {statistics.fmean(rounds):.1f} |",
                flush=True,
            )
            if best is None or acc > best[1]:
                best = (exponent, acc)
        print(f"\nbest lambda = beta on {dataset}: 2^{best[0]} (ACC {best[1]:.2f})")


if __name__ == "__main__":
    main()
