"""Files larger than memory, measured: parsing a 204 MB file into the node cache, k-FED's and FFCM's local
steps and the report's statistics over its memory map allocate a small fraction of it, never a whole
copy; k-FED's sampled local k-means merges and clusters like the whole one."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import normalized_mutual_info_score

from clients import kfed
from clients.ffcm import local_init, membership_sums
from fedapp.maths.clustering import nearest_centre
from fedapp.metrics.label_free import cluster_sums, distance_sums, pooled_means
from fedapp.privacy.floor import floored_kmeans, merge_small_clusters, merge_small_sums
from fedapp.report.stages import nearest_with_distance

ROWS, WIDTH, K = 1_600_000, 32, 20  # 205 MB of float32


def _blobs_memmap(path: Path, rows: int = ROWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A float32 .npy of blobs written a block at a time (never whole in memory), memory-mapped; labels."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10.0, 10.0, (K, WIDTH))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, WIDTH))
    labels = rng.integers(0, K, rows)
    for start in range(0, rows, 250_000):
        block = labels[start : start + 250_000]
        out[start : start + len(block)] = centres[block] + rng.normal(size=(len(block), WIDTH))
    out.flush()
    del out
    return np.load(path, mmap_mode="r"), labels


def test_the_local_steps_and_the_report_over_a_memory_map_do_not_copy_it(tmp_path: Path) -> None:
    X, truth = _blobs_memmap(tmp_path / "site.npy")
    assert isinstance(X, np.memmap) and X.nbytes == 204_800_000
    tracemalloc.start()
    try:
        probe = np.ones(4_000_000)  # NumPy's buffers are traced: the measure sees a 32 MB array
        assert tracemalloc.get_traced_memory()[1] >= probe.nbytes
        del probe
        tracemalloc.reset_peak()
        centres, counts, _ = kfed.local_centres(X, K, seed=0, restarts=1)  # sampled + chunked Lloyd
        kfed_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        fcm_centres, _ = local_init(X, K, 2.0, seed=0)  # FFCM round 1 (sampled FCM, mass over all)
        membership_sums(X, fcm_centres, 2.0)  # a later round: exact sums, chunked
        ffcm_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        labels, _ = nearest_with_distance(X, centres)  # the report's stages
        sums = cluster_sums(X, labels, K)
        distance_sums(X, labels, pooled_means(sums), sums.counts)
        report_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a float64 copy would be 410 MB, a float32 one 205 MB (128 bytes a record); the report's labels,
    # distances and their checked copies (8 bytes a record each, 13 MB) are its own
    peaks = {"k-FED": kfed_peak, "FFCM": ffcm_peak, "report": report_peak}
    print(", ".join(f"{what} {peak / 1e6:.0f} MB" for what, peak in peaks.items()), "traced over the map")
    for what, peak in peaks.items():
        assert peak < X.nbytes / 3, f"{what} allocated {peak / 1e6:.0f} MB over a {X.nbytes / 1e6:.0f} MB map"
    assert counts.sum() == ROWS
    assert normalized_mutual_info_score(truth, labels) > 0.99


def test_streaming_a_file_into_the_node_cache_holds_one_batch_not_the_file(tmp_path: Path) -> None:
    """Peak RSS of a fresh process that streams a 200 MB Parquet file into its node cache: well below the
    file (the whole read holds it at least once, and pandas' frame a second time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    width = 64  # wide rows: the labels (16 bytes a record while parsing) are a small part of the file
    centres = rng.uniform(-10.0, 10.0, (K, width)).astype(np.float32)
    path = tmp_path / "site.parquet"
    fields = [*(pa.field(f"f{j}", pa.float32()) for j in range(width)), pa.field("label", pa.int64())]
    schema = pa.schema(fields)
    with pq.ParquetWriter(path, schema, use_dictionary=False, compression="none") as writer:
        for _ in range(12):  # 750,000 records (200 MB) in row groups of 62,500 (16 MB): a reader holds one
            labels = rng.integers(0, K, 62_500)
            block = centres[labels] + rng.standard_normal((62_500, width), dtype=np.float32)
            columns = [pa.array(block[:, j]) for j in range(width)] + [pa.array(labels)]
            writer.write_batch(pa.record_batch(columns, schema=schema))
    small = tmp_path / "small.parquet"
    pq.write_table(pq.read_table(path).slice(0, 40_000), small)
    script = f"""
from fedapp.datasets import streaming
streaming.STREAM_ABOVE_BYTES = 0  # the small warm-up file streams too
import json
from pathlib import Path
import numpy as np
from fedapp.datasets import Columns
from fedapp.datasets.local import _node_cached
from fedapp.datasets.sources import read_source

def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024

def growth(parse):
    open("/proc/self/clear_refs", "w").write("5")  # the peak RSS starts again from now
    before = status("VmRSS")
    data = parse()
    return data, status("VmHWM") - before

def stream(spec, node):
    return _node_cached(spec, Columns(), None, (1,), None, Path("{tmp_path}") / node)

stream("parquet:{small}", "warm")  # lazy imports and the allocators' first arenas are not the file's
streamed, grown = growth(lambda: stream("parquet:{path}", "node"))
vectors = streamed.vectors
del streamed
_, whole = growth(lambda: read_source("parquet:{path}"))
print(json.dumps({{"streamed": grown, "whole": whole, "memmap": isinstance(vectors, np.memmap),
    "shape": list(vectors.shape), "dtype": str(vectors.dtype)}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["memmap"] and measured["shape"] == [750_000, width] and measured["dtype"] == "float32"
    size, streamed, whole = path.stat().st_size, measured["streamed"], measured["whole"]
    print(
        f"{size / 1e6:.0f} MB Parquet: peak RSS +{streamed / 1e6:.0f} MB streamed, +{whole / 1e6:.0f} MB read"
    )
    assert whole > size  # the measure sees a whole read
    # about one row group's pages (Arrow's pool: ~1.3x the group) and the labels (16 bytes a record)
    # while parsing; the features never
    # a copy of the features alone would be 192 MB (0.97 of the file): none is held
    assert streamed < 0.6 * size and streamed < whole / 5, (
        f"the streamed parse grew by {streamed / 1e6:.0f} MB"
    )


def test_merging_by_sums_equals_merging_rows() -> None:
    rng = np.random.default_rng(3)
    points = rng.normal(size=(400, 3))
    labels = rng.choice(8, 400, p=[0.3, 0.3, 0.2, 0.1, 0.05, 0.03, 0.015, 0.005])
    merged_labels, merged = merge_small_clusters(points, labels, floor=25)
    kept = np.unique(merged_labels)
    expected = np.stack([points[merged_labels == c].sum(0) for c in kept])
    sums = np.stack([points[labels == c].sum(0) for c in range(8)])
    by_sums, counts, merged_by_sums = merge_small_sums(sums, np.bincount(labels, minlength=8), floor=25)
    assert merged_by_sums == merged > 0
    np.testing.assert_array_equal(counts, [np.sum(merged_labels == c) for c in kept])
    np.testing.assert_allclose(by_sums, expected, atol=1e-12)


def test_sampled_local_kmeans_clusters_like_the_whole_and_repeats_with_the_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(0)
    centres = rng.uniform(-10.0, 10.0, (6, 4))
    truth = rng.integers(0, 6, 20_000)
    X = (centres[truth] + rng.normal(size=(20_000, 4))).astype(np.float32)
    whole = floored_kmeans(X, 6, 1, 5, n_init=1)
    monkeypatch.setattr(kfed, "LOCAL_SAMPLE", 2_000)
    sampled = kfed.local_centres(X, 6, seed=1, restarts=1)
    again = kfed.local_centres(X, 6, seed=1, restarts=1)
    np.testing.assert_array_equal(sampled[0], again[0])
    assert sampled[1].sum() == len(X)
    nmi = [normalized_mutual_info_score(truth, nearest_centre(X, c)) for c in (whole[0], sampled[0])]
    assert nmi[1] >= nmi[0] - 0.01 and nmi[1] > 0.95
