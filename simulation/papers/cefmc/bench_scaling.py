"""Maths-only CeFMC wall time as N doubles (Sec. IV-D claims linear complexity in N).

Run: ``python -m simulation.papers.cefmc.bench_scaling [--sizes 10000 20000 40000] [--rounds 10]``.
It times `simulation.papers.cefmc.reference.run_cefmc` (initialisation SVDs + k-means + a fixed number of
rounds, no early stop) on synthetic Gaussian-cluster views and prints the time ratio per doubling of N, for
the whole run and for its rounds alone; linear scaling gives about 2 (the issue's target is <= 2.3). Each
size is timed `--repeats` times, best kept. BLAS/OpenMP run on `--threads` threads (default 1): on a
machine shared with other jobs, multi-threaded OpenBLAS spin-waits and made 10 rounds at N = 10k take
5 s instead of 0.2 s, which measures the neighbours, not the algorithm.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from clients.cefmc import init_embedding
from simulation.papers.cefmc.reference import run_cefmc
from strategies.cefmc import initialise_consensus

VIEW_DIMS = (100, 50, 20)
N_CLUSTERS = 10


def make_multiview_clusters(
    n_samples: int, view_dims: Sequence[int] = VIEW_DIMS, n_clusters: int = N_CLUSTERS, seed: int = 0
) -> list[np.ndarray]:
    """Views of the same latent clusters: per view, random centres plus unit Gaussian noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_clusters, n_samples)
    return [
        2.0 * rng.normal(size=(n_clusters, d))[labels] + rng.normal(size=(n_samples, d)) for d in view_dims
    ]


def _best_time(run: Callable[[], object], repeats: int) -> float:
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def time_cefmc(n_samples: int, *, rounds: int, repeats: int, seed: int) -> tuple[float, float]:
    """Best-of-`repeats` seconds of a whole CeFMC run with exactly `rounds` rounds, and of its initialisation.

    The initialisation (V SVDs + k-means on H_c^(0), Eq. 20-22) is timed on its own so that the per-round
    cost (whole run minus initialisation) can be read separately: k-means iteration counts vary with N.
    """
    views = make_multiview_clusters(n_samples, seed=seed)

    def whole_run() -> None:
        run = run_cefmc(views, N_CLUSTERS, lam=1.0, delta=None, max_rounds=rounds, seed=seed)
        if run.n_rounds != rounds:
            raise RuntimeError(f"expected {rounds} rounds, ran {run.n_rounds}")

    def initialisation() -> None:
        H_views = [
            init_embedding(X, N_CLUSTERS, np.random.default_rng([seed, v])) for v, X in enumerate(views)
        ]
        initialise_consensus(H_views, N_CLUSTERS, seed=seed)

    return _best_time(whole_run, repeats), _best_time(initialisation, repeats)


def main(argv: Sequence[str] | None = None) -> None:
    """Print one line per size with the time and its ratio to the previous size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 20_000, 40_000])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads")
    args = parser.parse_args(argv)
    print(
        f"CeFMC maths only: views {VIEW_DIMS}, k={N_CLUSTERS}, {args.rounds} rounds, "
        f"best of {args.repeats}, {args.threads} thread(s)"
    )
    previous: tuple[int, float, float] | None = None
    for n_samples in args.sizes:
        with threadpool_limits(limits=args.threads):
            total, init = time_cefmc(n_samples, rounds=args.rounds, repeats=args.repeats, seed=args.seed)
        rounds_time = total - init
        line = f"N={n_samples:>7d}  total {total:7.3f} s  (init {init:6.3f} s, rounds {rounds_time:6.3f} s)"
        if previous is not None:
            size_ratio = n_samples / previous[0]
            line += (
                f"  ratio per x{size_ratio:g} N: total {total / previous[1]:.2f}, "
                f"rounds {rounds_time / (previous[1] - previous[2]):.2f}"
            )
        print(line)
        previous = (n_samples, total, init)


if __name__ == "__main__":
    main()
