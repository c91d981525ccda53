"""Privacy-utility sweep over epsilon in {0.5, 1, 2, 4, 8, inf (DP off)} at delta = 1e-5, 3 seeds: FFCM and
k-FED on MNIST (10 clients, IID p = 0 and p-hetero p = 0.5), FSTC on StackOverflow (4 IID clients; under
DP `fstc.dp-labels = centres` with `--fstc-dp-rounds` rounds, DP off its published defaults); a markdown
table of NMI / ACC mean +- std and a plot (NMI against epsilon).

    python -m simulation.bench.privacy_sweep --max-samples 10000 --out results/privacy-sweep
    python -m simulation.bench.privacy_sweep --methods fstc --out results/privacy-sweep \
        --plot docs/privacy-utility-fstc.png             # FSTC: ~30 s a DP run, 5-7 min DP off (2 cores)
    python -m simulation.bench.privacy_sweep --quick       # 1 seed, 3 epsilons, 3000 samples: a smoke run

FFCM runs with `ffcm.init=moments` at every epsilon (DP forces it), so epsilon = inf differs from the
private runs only by clipping and noise. Runs use the in-process engine; a run whose summary.json exists
is read, not rerun (resumable). DP noise is drawn from OS entropy, so reruns differ within the spread.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedapp.launch.resolve import build_overrides
from fedapp.report.records import save_figure
from simulation.runner import execute

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
METRICS = ("nmi", "acc")
# method -> (dataset, clients, p-hetero p values): the settings the issue asks for
SETTINGS: dict[str, tuple[str, int, tuple[float, ...]]] = {
    "ffcm": ("mnist", 10, (0.0, 0.5)),
    "kfed": ("mnist", 10, (0.0, 0.5)),
    "fstc": ("stackoverflow", 4, (0.0,)),
}


def run_one(out: Path, method: str, p: float, epsilon: float, seed: int, args: argparse.Namespace) -> dict:
    """One run's final metrics (read back when it already ran)."""
    summary_path = out / "summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        if summary.get("status") in ("completed", "converged"):
            return summary
    dataset, clients, _ = SETTINGS[method]
    base: dict[str, Any] = {
        "method": method,
        "dataset": dataset,
        "num-clients": clients,
        "seed": seed,
        "max-samples": args.max_samples,
        "dp.delta": args.delta,
        "dp.clip": args.clip,
        "dp.epsilon": 0.0 if math.isinf(epsilon) else epsilon,
    }
    if method == "fstc":  # IID clients; DP off: FSTC as published (its default rounds, trained model)
        base["partition"] = "iid"
        if not math.isinf(epsilon):  # under DP it labels by the DP centres: a DP Lloyd, few rounds
            base["num-rounds"] = args.fstc_dp_rounds
    else:
        base.update({"partition": "p-hetero", "p": p, "num-rounds": args.rounds})
    if method == "ffcm":
        base["ffcm.init"] = "moments"
    return execute(build_overrides(base, out), "inprocess", quiet=True, overwrite=True)


def rows(methods: Sequence[str]) -> list[tuple[str, float]]:
    """(method, p) of every table row / plot curve."""
    return [(method, p) for method in methods for p in SETTINGS[method][2]]


def label(epsilon: float) -> str:
    return "inf (off)" if math.isinf(epsilon) else f"{epsilon:g}"


def sweep(args: argparse.Namespace) -> dict[tuple[str, float, float], dict[str, list[float]]]:
    """(method, p, epsilon) -> metric -> one value per seed."""
    results: dict[tuple[str, float, float], dict[str, list[float]]] = {}
    for method, p in rows(args.methods):
        for epsilon in args.epsilons:
            cell = results.setdefault((method, p, epsilon), {m: [] for m in METRICS})
            for seed in range(args.seeds):
                name = f"{method}-p{p:g}-eps{label(epsilon).split()[0]}-s{seed}"
                summary = run_one(args.out / name, method, p, epsilon, seed, args)
                for metric in METRICS:
                    cell[metric].append(float(summary["metrics"][metric]))
                spent = (summary.get("privacy", {}).get("dp") or {}).get("epsilon_spent")
                shown = f" eps spent {spent:.3f}" if spent is not None else ""
                print(f"{name}: NMI {cell['nmi'][-1]:.4f} ACC {cell['acc'][-1]:.4f}{shown}", flush=True)
    return results


def markdown(
    results: dict[tuple[str, float, float], dict[str, list[float]]],
    epsilons: Sequence[float],
    methods: Sequence[str],
) -> str:
    """Rows: method x p; columns: epsilon; cells: NMI / ACC as mean +- std in percent."""
    header = "| method | p | " + " | ".join(f"eps={label(e)}" for e in epsilons) + " |"
    lines = [header, "|" + "---|" * (len(epsilons) + 2)]
    for method, p in rows(methods):
        cells = []
        for epsilon in epsilons:
            values = results[(method, p, epsilon)]
            cells.append(
                " / ".join(f"{100 * np.mean(values[m]):.1f} ± {100 * np.std(values[m]):.1f}" for m in METRICS)
            )
        lines.append(f"| {method} | {p:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(
    results: dict[tuple[str, float, float], dict[str, list[float]]],
    epsilons: Sequence[float],
    methods: Sequence[str],
    path: Path,
) -> None:
    """NMI against epsilon (log axis; DP off drawn as a dashed line per curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [e for e in epsilons if not math.isinf(e)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for index, (method, p) in enumerate(rows(methods)):
        colour = f"C{index}"
        means = [100 * np.mean(results[(method, p, e)]["nmi"]) for e in finite]
        stds = [100 * np.std(results[(method, p, e)]["nmi"]) for e in finite]
        name = f"{method}, {SETTINGS[method][0]}, {SETTINGS[method][1]} clients, p={p:g}"
        ax.errorbar(finite, means, yerr=stds, marker="o", capsize=3, color=colour, label=name)
        if math.inf in epsilons:
            ax.axhline(
                100 * np.mean(results[(method, p, math.inf)]["nmi"]), color=colour, linestyle="--", alpha=0.6
            )
    ax.set_xscale("log")
    ax.set_xticks(finite, [f"{e:g}" for e in finite])  # plain epsilons, not 3 x 10^0
    ax.minorticks_off()
    ax.set_xlabel("epsilon (delta = 1e-5); dashed: DP off")
    ax.set_ylabel("NMI (%)")
    ax.set_title("privacy vs utility")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    save_figure(fig, path, dpi=100)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m simulation.bench.privacy_sweep", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("results/privacy-sweep"), help="run directories")
    parser.add_argument(
        "--methods", nargs="+", choices=sorted(SETTINGS), default=["ffcm", "kfed"], help="rows to run"
    )
    parser.add_argument("--rounds", type=int, default=5, help="FFCM rounds (k-FED is one-shot)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-samples", type=int, default=0, help="> 0: a class-stratified subsample")
    parser.add_argument(
        "--fstc-dp-rounds",
        type=int,
        default=6,
        help="FSTC's rounds under DP (1 init + Lloyd steps on the DP centres; more rounds, more noise each)",
    )
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="1 seed, epsilon 1 / 8 / off, 3000 samples")
    parser.add_argument("--epsilons", type=float, nargs="+", help="a subset of the epsilons (inf: DP off)")
    parser.add_argument("--plot", type=Path, default=Path("docs/privacy-utility.png"))
    args = parser.parse_args(argv)
    args.epsilons = tuple(args.epsilons) if args.epsilons else EPSILONS
    if args.quick:
        args.seeds, args.epsilons, args.max_samples = 1, (1.0, 8.0, math.inf), args.max_samples or 3000
    results = sweep(args)
    print()
    print(markdown(results, args.epsilons, args.methods))
    plot(results, args.epsilons, args.methods, args.plot)
    print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
