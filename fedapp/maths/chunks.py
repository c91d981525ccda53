"""Row chunks: per-record maths over a large local file in bounded memory.

A site with millions of records must not materialise n x k float64 temporaries (a 2.5 M x 20 distance
matrix is 400 MB, and every elementwise step makes another), nor a float64 copy of float32 features.
The kernels in `fedapp.maths.clustering`, `fedapp.metrics.label_free` and the FCM client walk the rows
in chunks of about `CHUNK_ELEMENTS` values per temporary, converting one chunk at a time to float64,
on one BLAS thread: a 32,768 x 32 by 32 x 20 product took 7.6 ms on one thread and 52-1,000 ms on two
with other jobs on the 2 cores (FCM's membership sums over 250,000 records: 0.7 s against 1.7-12 s).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from fedapp.maths.threads import one_blas_thread

CHUNK_ELEMENTS = 1 << 20  # float64 values per temporary (8 MiB): stays in cache-friendly sizes, bounds memory


def row_chunks(n_rows: int, width: int, elements: int | None = None) -> Iterator[slice]:
    """Consecutive row slices covering `n_rows`, each at most `elements` (default `CHUNK_ELEMENTS`, read at
    call time) // `width` rows, at least one."""
    step = max(1, (elements or CHUNK_ELEMENTS) // max(1, width))
    with one_blas_thread():  # a chunk's products are small: BLAS threads cost more than they save
        for start in range(0, n_rows, step):
            yield slice(start, min(start + step, n_rows))


def as_float(X: np.ndarray) -> np.ndarray:
    """`X` itself if it is float32 or float64 (no copy), else as float64: what the kernels accept."""
    X = np.asarray(X)
    return X if X.dtype in (np.float32, np.float64) else X.astype(np.float64)
