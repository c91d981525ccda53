"""Own data at scale: pooled k-means against federated k-FED and FFCM on the same files, n = 10^5 .. 10^7.

    python -m simulation.bench.scale [--sizes 100000 1000000 10000000] [--work DIR] [--plot docs/scale.png]
    python -m simulation.bench.scale --deploy 1000000 [--rounds 6]
    python -m simulation.bench.scale --embeddings 2000
    python -m simulation.bench.scale --capped 4400000 [--sites 2 --width 128 --cap-mb 1024]
    python -m simulation.bench.scale --local-kmeans 250000

For each n it writes 4 Parquet files (`make_blobs`: 32 float32 features, 20 centres, a `label` column;
each site drawn around the same centres), then runs, each as its own process (one process tree):

- pooled: `pd.read_parquet` of the 4 files + scikit-learn `KMeans(20, n_init=1)`, NMI to the labels;
- `fedapp run --method kfed` and `--method ffcm --rounds 10`, in-process engine, k = 20.

It prints wall seconds, per-stage seconds (read / fit for pooled; start-up + reading, round 1, later
rounds, final report for the federated runs, from summary.json) and the peak RSS of the process tree
(sampled every 0.5 s, `simulation.bench.rounds`), as a Markdown table, and saves a log-log plot.
`--deploy N`: a loopback deployment (`deploy/run_local.py`: a SuperLink and 3 SuperNodes, each reading
only its own N-record file, so every message's ClientApp process maps the node's parsed-array cache)
of FFCM against `bench-echo` on the same files with FFCM's payload: the median of rounds 2 .. R-1.
`--capped N [--sites 2 --width 128 --cap-mb 1024]`: k-FED and FFCM on files larger than the memory the run
may take (`prlimit --data`, RLIMIT_DATA), written a row group at a time; wall, peak RSS (and its anonymous
and file-backed parts) and NMI.
`--local-kmeans N`: k-FED's local step on one site that fits, today's whole k-means against the sampled
one with exact chunked passes (seconds, NMI), on N blobs and MNIST.
`--embeddings N`: texts/s of fedapp's encoding path and of sentence-transformers' `encode` called
directly, same titles, batch size 64 and model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

# the pooled baseline's child process imports only what a user's script would (pandas, scikit-learn):
# fedapp's and Flower's imports are the federated runs' own cost, taken in the functions that need them
PROJECT_ROOT = Path(__file__).resolve().parents[2]
SITES, FEATURES, CENTRES = 4, 32, 20
FFCM_ROUNDS = 10
LARGE_ROW_GROUP = 65_536  # `generate_large`: 32 MiB a row group at 128 float32 features


def generate(n: int, folder: Path, sites: int = SITES, seed: int = 0) -> str:
    """`sites` Parquet files of n records in all (made once per folder); returns the source spec."""
    import pandas as pd
    from sklearn.datasets import make_blobs

    folder.mkdir(parents=True, exist_ok=True)
    centres = np.random.default_rng(seed).uniform(-10.0, 10.0, (CENTRES, FEATURES))  # make_blobs' box
    for site, size in enumerate(np.array_split(np.arange(n), sites)):
        path = folder / f"site-{site}.parquet"
        if path.exists():
            continue
        X, y = make_blobs(n_samples=len(size), centers=centres, random_state=seed + site + 1)
        frame = pd.DataFrame(X.astype(np.float32), columns=[f"f{j}" for j in range(FEATURES)])
        frame["label"] = y
        frame.to_parquet(path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
    return f"parquet:{folder}/site-{{partition-id}}.parquet"


def pooled(folder: Path) -> dict[str, float]:
    """The baseline a new user would write (run in a child process by `measured`)."""
    import pandas as pd
    from sklearn.cluster import KMeans
    from sklearn.metrics import normalized_mutual_info_score

    started = time.perf_counter()
    frame = pd.concat([pd.read_parquet(path) for path in sorted(folder.glob("site-*.parquet"))])
    X, y = frame.drop(columns="label").to_numpy(), frame["label"].to_numpy()
    read = time.perf_counter()
    labels = KMeans(CENTRES, n_init=1, random_state=0).fit(X).labels_
    fit = time.perf_counter()
    return {"read_s": read - started, "fit_s": fit - read, "nmi": normalized_mutual_info_score(y, labels)}


def measured(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS of the process tree in MB, stdout) of one command."""
    from simulation.bench.rounds import run_sampled

    started = time.monotonic()
    status, stdout, stderr, peak = run_sampled(command, subprocess.PIPE)
    if status:
        raise RuntimeError(f"{' '.join(command)} failed: {stderr.decode()[-2000:]}")
    return time.monotonic() - started, peak, stdout.decode()


def federated_row(command: list[str], out: Path) -> dict[str, Any]:
    wall, peak, _ = measured([*command, "--out", str(out), "--overwrite"])
    summary = json.loads((out / "summary.json").read_text())
    rounds = {int(r): t["round_s"] for r, t in summary["timing"].items() if "round_s" in t}
    report = float(summary["report"]["seconds"])
    later = sum(s for r, s in rounds.items() if r >= 2)
    return {
        "wall_s": wall,
        "peak_mb": peak,
        "nmi": summary["metrics"].get("nmi"),
        "rounds": len(rounds),
        "round1_s": rounds.get(1, 0.0),
        "later_rounds_s": later,
        "report_s": report,
        "other_s": wall - sum(rounds.values()) - report,  # interpreter start-up, preflight (reads the files)
        "summary": summary,
    }


def run_size(n: int, work: Path) -> dict[str, dict[str, Any]]:
    from simulation.bench.rounds import _set_args

    folder = work / f"n{n}"
    spec = generate(n, folder)
    python = [sys.executable]
    wall, peak, stdout = measured([*python, "-m", "simulation.bench.scale", "--pooled", str(folder)])
    rows: dict[str, dict[str, Any]] = {"pooled": {"wall_s": wall, "peak_mb": peak, **json.loads(stdout)}}
    base = [*python, "-m", "simulation", "run", "--dataset", spec, "--clients", str(SITES), "--engine"]
    base += ["inprocess", *_set_args({"k": CENTRES, "label-column": "label"})]
    rows["kfed"] = federated_row([*base, "--method", "kfed"], folder / "out-kfed")
    ffcm = [*base, "--method", "ffcm", "--rounds", str(FFCM_ROUNDS)]
    rows["ffcm"] = federated_row(ffcm, folder / "out-ffcm")
    return rows


def generate_large(n: int, folder: Path, sites: int, width: int, seed: int = 0) -> str:
    """`sites` Parquet files of n records in all, `width` float32 features around `CENTRES` centres
    (make_blobs' box and unit spread), written one row group of `LARGE_ROW_GROUP` records at a time: the
    files may be larger than this machine's memory (a Parquet reader holds about one row group's pages).
    Made once per folder; returns the source spec."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10.0, 10.0, (CENTRES, width)).astype(np.float32)
    fields = [*(pa.field(f"f{j}", pa.float32()) for j in range(width)), pa.field("label", pa.int64())]
    schema = pa.schema(fields)
    for site, size in enumerate(np.array_split(np.arange(n), sites)):
        path = folder / f"site-{site}.parquet"
        if path.exists():
            continue
        with pq.ParquetWriter(path.with_suffix(".tmp"), schema, use_dictionary=False) as writer:
            for start in range(0, len(size), LARGE_ROW_GROUP):
                labels = rng.integers(0, CENTRES, min(LARGE_ROW_GROUP, len(size) - start))
                block = centres[labels] + rng.standard_normal((len(labels), width), dtype=np.float32)
                columns = [pa.array(block[:, j]) for j in range(width)] + [pa.array(labels)]
                writer.write_batch(pa.record_batch(columns, schema=schema))
        path.with_suffix(".tmp").rename(path)
    return f"parquet:{folder}/site-{{partition-id}}.parquet"


def capped_row(n: int, sites: int, width: int, cap_mb: int, work: Path, method: str) -> dict[str, Any]:
    """One in-process run under `prlimit --data` (RLIMIT_DATA: the heap, anonymous and private writable
    maps, thread stacks - what a copy of the data would need; a read-only file map such as the node
    cache's is not counted, and its pages are the page cache's to drop). Peak RSS and its anonymous part
    are sampled every 0.5 s from /proc; the run fails with MemoryError if it needs more than the cap."""
    from simulation.bench.rounds import _set_args

    folder = work / f"capped-n{n}-s{sites}-d{width}"
    spec = generate_large(n, folder, sites, width)
    out = folder / f"out-{method}-cap{cap_mb}"
    command = ["prlimit", f"--data={cap_mb << 20}", "--", sys.executable, "-m", "simulation", "run"]
    command += ["--dataset", spec, "--clients", str(sites), "--engine", "inprocess", "--method", method]
    command += [*_set_args({"k": CENTRES, "label-column": "label"}), "--out", str(out), "--overwrite"]
    if method == "ffcm":
        command += ["--rounds", str(FFCM_ROUNDS)]
    started = time.monotonic()
    # Arrow's default allocator (mimalloc) reserves 1 GiB of address space up front, never touched but
    # counted by RLIMIT_DATA: the system allocator reserves nothing (what a capped user would set too)
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"}
    process = subprocess.Popen(
        command, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    peaks = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0, "VmData": 0}
    while process.poll() is None:
        try:
            lines = Path(f"/proc/{process.pid}/status").read_text().splitlines()
        except OSError:
            break
        for line in lines:
            key, _, value = line.partition(":")
            if key in peaks:
                peaks[key] = max(peaks[key], int(value.split()[0]) // 1024)
        time.sleep(0.5)
    stderr = process.communicate()[1]
    wall = time.monotonic() - started
    if process.returncode:
        raise RuntimeError(f"{' '.join(command)} failed: {stderr.decode()[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    site_bytes = max(path.stat().st_size for path in folder.glob("site-*.parquet"))
    return {
        "method": method,
        "n": n,
        "sites": sites,
        "width": width,
        "site_file_mb": site_bytes >> 20,
        "cap_mb": cap_mb,
        "wall_s": wall,
        "peak_rss_mb": peaks["VmRSS"],
        "peak_anon_mb": peaks["RssAnon"],
        "peak_file_mb": peaks["RssFile"],
        "peak_data_mb": peaks["VmData"],  # what RLIMIT_DATA counts
        "nmi": summary["metrics"].get("nmi"),
        "command": "ARROW_DEFAULT_MEMORY_POOL=system " + " ".join(command),
    }


def local_kmeans_ab(n: int, data_dir: Path, seeds: int = 3) -> list[dict[str, Any]]:
    """k-FED's local step on one site that fits in memory, today's whole k-means (`floored_kmeans`, one
    restart: the auto setting above 50,000 records) against the sampled one (`local_centres` above
    `LOCAL_SAMPLE`): seconds and NMI to the labels, per seed, on float32 blobs (unit and 4x spread) of
    n x 32 and on MNIST's 70,000 x 784 as one site."""
    from sklearn.metrics import normalized_mutual_info_score

    from clients.kfed import local_centres
    from fedapp.datasets import load_dataset
    from fedapp.maths.clustering import nearest_centre
    from fedapp.privacy.floor import CLIENT_MIN_CLUSTER, floored_kmeans

    centres = np.random.default_rng(0).uniform(-10.0, 10.0, (CENTRES, FEATURES))
    sets: list[tuple[str, np.ndarray, np.ndarray, int]] = []
    for spread in (1.0, 4.0):
        rng = np.random.default_rng(1)
        truth = rng.integers(0, CENTRES, n)
        X = (centres[truth] + spread * rng.standard_normal((n, FEATURES))).astype(np.float32)
        sets.append((f"blobs {n} x {FEATURES}, spread {spread:g}", X, truth, CENTRES))
    if (data_dir / "mnist").exists():
        mnist = load_dataset("mnist", data_dir)
        sets.append(("MNIST 70,000 x 784", mnist.features.astype(np.float32), mnist.y, mnist.n_classes))
    rows = []
    for name, X, truth, k in sets:
        for seed in range(seeds):
            for path in ("whole", "sampled"):
                started = time.perf_counter()
                if path == "whole":
                    found = floored_kmeans(X, k, seed, CLIENT_MIN_CLUSTER, n_init=1)[0]
                else:
                    found = local_centres(X, k, seed, restarts=1)[0]
                seconds = time.perf_counter() - started
                nmi = normalized_mutual_info_score(truth, nearest_centre(X, found))
                rows.append({"data": name, "seed": seed, "path": path, "seconds": seconds, "nmi": nmi})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def deploy_row(n: int, work: Path, rounds: int) -> dict[str, Any]:
    """FFCM and bench-echo (FFCM's payload) on 3 SuperNodes of n records each: median later round."""
    from simulation.bench.rounds import _set_args, training_rounds

    folder = work / f"deploy-n{n}"
    spec = generate(3 * n, folder, sites=3)
    base = [sys.executable, "deploy/run_local.py", "--node-data", spec, "--dataset", spec, "--clients", "3"]
    base += [
        "--rounds",
        str(rounds),
        *_set_args({"k": CENTRES, "label-column": "label", "eval-every": rounds}),
    ]
    result: dict[str, Any] = {"n_per_node": n}
    echo_keys = {
        "bench-echo.up-floats": CENTRES * (FEATURES + 1),
        "bench-echo.down-floats": CENTRES * FEATURES,
    }
    for method, keys in (("ffcm", {"ffcm.delta": 0.0}), ("bench-echo", echo_keys)):
        out = folder / f"out-{method}"
        wall, peak, _ = measured(
            [*base, "--method", method, *_set_args(keys), "--out", str(out), "--overwrite"]
        )
        summary = json.loads((out / "summary.json").read_text())
        later = [summary["timing"][str(r)]["round_s"] for r in training_rounds(summary, 2)]
        result[method] = {
            "wall_s": wall,
            "peak_mb": peak,
            "round1_s": summary["timing"]["1"]["round_s"],
            "later_round_s": float(np.median(later)) if later else None,
        }
    return result


def embedding_throughput(
    count: int, data_dir: Path, batch_size: int = 64, repeats: int = 2
) -> dict[str, float]:
    """Texts/s of fedapp's encoding path (`_encode`: length-sorted batches) against sentence-transformers'
    own `model.encode` on the same StackOverflow titles, batch size and loaded model, alternating."""
    from fedapp.features.embeddings import _encode, load_sentence_model
    from simulation.bench.embeddings import _titles

    texts = _titles(data_dir)[:count]
    model = load_sentence_model(device="cpu")
    model.encode(texts[:batch_size], batch_size=batch_size)  # warm-up
    rates: dict[str, list[float]] = {"sentence-transformers": [], "fedapp": []}
    for _ in range(repeats):
        for name in rates:
            started = time.perf_counter()
            if name == "fedapp":
                _encode(model, texts, batch_size=batch_size, normalize=False, progress=False, label="")
            else:
                model.encode(texts, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True)
            rates[name].append(len(texts) / (time.perf_counter() - started))
    return {f"{name} texts/s": float(np.median(values)) for name, values in rates.items()}


def table(results: dict[int, dict[str, dict[str, Any]]]) -> str:
    lines = [
        "| n | run | wall s | stages (s) | peak RSS GB | NMI | wall / pooled | RSS / pooled |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, rows in sorted(results.items()):
        base = rows["pooled"]
        for name, row in rows.items():
            if name == "pooled":
                stages = f"read {row['read_s']:.1f}, fit {row['fit_s']:.1f}"
            else:
                stages = (
                    f"start+read {row['other_s']:.1f}, round 1 {row['round1_s']:.1f}, "
                    f"rounds 2+ {row['later_rounds_s']:.1f}, report {row['report_s']:.1f}"
                )
            nmi = "" if row.get("nmi") is None else f"{row['nmi']:.4f}"
            lines.append(
                f"| {n:.0e} | {name} | {row['wall_s']:.1f} | {stages} | {row['peak_mb'] / 1e3:.2f} | {nmi} | "
                f"{row['wall_s'] / base['wall_s']:.2f} | {row['peak_mb'] / base['peak_mb']:.2f} |"
            )
    return "\n".join(lines)


def plot(results: dict[int, dict[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(results)
    figure, (seconds, memory) = plt.subplots(1, 2, figsize=(10, 4))
    for name in ("pooled", "kfed", "ffcm"):
        measured_sizes = [n for n in sizes if name in results[n]]  # a size may lack a run (too slow)
        walls = [results[n][name]["wall_s"] for n in measured_sizes]
        seconds.loglog(measured_sizes, walls, "o-", label=name)
        memory.loglog(
            measured_sizes, [results[n][name]["peak_mb"] / 1e3 for n in measured_sizes], "o-", label=name
        )
    seconds.set(xlabel="records n (4 sites)", ylabel="wall seconds", title="time")
    memory.set(xlabel="records n (4 sites)", ylabel="peak RSS (GB)", title="memory")
    for axes in (seconds, memory):
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--work", type=Path, help="data and run folders (default: a temporary folder)")
    parser.add_argument("--plot", type=Path, help="save the log-log plot here (e.g. docs/scale.png)")
    parser.add_argument("--json", type=Path, help="save every number here")
    parser.add_argument("--deploy", type=int, metavar="N", help="the deployment row: 3 SuperNodes x N")
    parser.add_argument("--rounds", type=int, default=6, help="deployment rounds (default 6)")
    parser.add_argument(
        "--embeddings", type=int, metavar="N", help="text throughput on N StackOverflow titles"
    )
    parser.add_argument(
        "--capped",
        type=int,
        metavar="N",
        help="k-FED and FFCM on N records of --width features in --sites files, under a --cap-mb RLIMIT_DATA",
    )
    parser.add_argument("--sites", type=int, default=2, help="--capped: files (clients), default 2")
    parser.add_argument("--width", type=int, default=128, help="--capped: features, default 128")
    parser.add_argument("--cap-mb", type=int, default=1024, help="--capped: RLIMIT_DATA in MiB, default 1024")
    parser.add_argument("--methods", nargs="+", default=["kfed", "ffcm"], help="--capped: which runs")
    parser.add_argument(
        "--local-kmeans", type=int, metavar="N", help="k-FED's local step, whole against sampled, on N blobs"
    )
    parser.add_argument("--data-dir", type=Path, default=PROJECT_ROOT.parent / "shared" / "data")
    parser.add_argument("--pooled", type=Path, help=argparse.SUPPRESS)  # the baseline's child process
    args = parser.parse_args()
    if args.pooled:
        print(json.dumps(pooled(args.pooled)))
        return
    if args.embeddings:
        print(json.dumps(embedding_throughput(args.embeddings, args.data_dir), indent=1))
        return
    if args.local_kmeans:
        local_kmeans_ab(args.local_kmeans, args.data_dir)
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="fedapp-scale-"))
    if args.capped:
        for method in args.methods:
            row = capped_row(args.capped, args.sites, args.width, args.cap_mb, work, method)
            print(json.dumps(row, indent=1), flush=True)
        return
    if args.deploy:
        row = deploy_row(args.deploy, work, args.rounds)
        print(json.dumps(row, indent=1))
        if args.json:
            args.json.write_text(json.dumps(row, indent=1))
        return
    results = {}
    for n in args.sizes:
        results[n] = run_size(n, work)
        print(table({n: results[n]}), flush=True)
    print(table(results))
    if args.json:
        slim = {
            n: {k: {f: v for f, v in r.items() if f != "summary"} for k, r in rows.items()}
            for n, rows in results.items()
        }
        args.json.write_text(json.dumps(slim, indent=1))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
