"""Thread limits for the small dense maths of clients and strategies.

OpenBLAS (NumPy / SciPy) and scikit-learn's OpenMP start one thread per core for every call, however
small the matrix. For the N x K (K <= 152) products of FSTC's Gaussian-uniform mixture, or a client's
k-means, that costs more than it saves, and far more when another job holds the cores: a 4-round FSTC run
on StackOverflow (4 clients, in-process) took 193 s with OpenBLAS on two threads and 88 s on one, same
metrics, with a CCFC training on the same 2 cores. Ray clients already run with OMP_NUM_THREADS=1 (which
OpenBLAS honours); these limits give the in-process engine and the server the same. PyTorch's own
intra-op threads are not touched.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from functools import cache

from threadpoolctl import ThreadpoolController


def threadpools() -> ThreadpoolController:
    """Inspecting the loaded thread pools costs ~3 ms; limiting through one controller costs ~10 us. A
    controller only limits the libraries loaded when it was built: SciPy's own OpenBLAS and scikit-learn's
    OpenMP runtime come with their import, so a controller built before it would leave them alone
    (k-means on two OpenMP threads after a chunked distance had built one)."""
    return _controller("scipy.linalg" in sys.modules, "sklearn.cluster" in sys.modules)


@cache
def _controller(scipy_loaded: bool, sklearn_loaded: bool) -> ThreadpoolController:
    return ThreadpoolController()


def one_blas_thread() -> AbstractContextManager[object]:
    """NumPy / SciPy BLAS on one thread inside the block (not thread-safe across concurrent blocks)."""
    return threadpools().limit(limits=1, user_api="blas")


def one_openmp_thread() -> AbstractContextManager[object]:
    """scikit-learn's OpenMP loops on one thread inside the block."""
    return threadpools().limit(limits=1, user_api="openmp")
