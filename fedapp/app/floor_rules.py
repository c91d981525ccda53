"""What the privacy floor lets each method's clients send, known from the run config and a site's row
count alone — so that the checks before a run (`fedapp.app.preflight`) refuse what the clients would.

The floor (`fedapp.privacy.floor`) is max(5, the node's, the run's `min-cluster-size`). Per method, as its
client code does it (k' = the local centres a client of n records sends in the initialisation):

- `kfed`, `fbow`, `ftfidf`, `fsbert-kfed`: below the floor a client sends nothing (`capped_clusters`);
  k' = min(local-k or k, n // floor), under DP (DP-Lloyd) local-k or k; the server's k-means over the
  union fails below k.
- `ffcm` with `init = local-centres` (no SecAgg+, no DP): below the floor nothing; k' = min(k, n // floor);
  the merge fails below k. With moments (`init = moments`, SecAgg+, DP): below the floor nothing, no
  local centres.
- `fstc` and its ablations with `init = centres` (no SecAgg+, no DP), `fsccl`: below the floor nothing;
  k' = min(init-local-k or K (2K with init-merge = weighted), n // floor); the server pads below K (with a
  warning), so any total works.
- `ccfc`: below the floor nothing (its local centroids, from the last pre-training round on); always k
  merged centroids per client.
- `fstc` with moments or representations, `gfedntm`, the vertical methods, `bench-echo`: a small client
  runs (the final report withholds its small clusters).

Merging clusters below the floor can leave a client fewer centres than n // floor, so "the union reaches k"
is checked as a necessary condition: a run it refuses would fail for sure.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.run import RunConfig
from fedapp.methods.ffcm import FFCMConfig
from fedapp.methods.fsccl import FSCCLConfig
from fedapp.methods.fstc import FSTCConfig
from fedapp.methods.kfed import KFedConfig
from fedapp.methods.textkfed import TextKFedConfig

KFED_LIKE = ("kfed", "fbow", "ftfidf", "fsbert-kfed")
FSTC_LIKE = ("fstc", "fstc-stc", "fstc-rstc")


@dataclass(frozen=True)
class FloorRule:
    """How a method's clients meet the floor in this run (the module's table, for one run config)."""

    refuses_below_floor: bool = False  # a client with fewer records than the floor sends nothing
    asked: int = 0  # local centres each client is asked for in the initialisation (0: not such an init)
    capped: bool = False  # k' <= n // floor (plain runs; DP-Lloyd sends its k' noisy centres as asked)
    needs_k: bool = False  # the server's k-means over the clients' centres fails below k (no padding)

    def sendable(self, n_records: int, floor: int) -> int:
        """Local centres a client of `n_records` can send in the initialisation."""
        if not self.asked:
            return 0
        return max(1, min(self.asked, n_records // floor)) if self.capped else self.asked


def run_floor(cfg: RunConfig) -> int:
    """The floor every client enforces at least: max(the client's own default, the run config's) (a node
    config can only raise it further, on its own node)."""
    from fedapp.privacy.floor import min_cluster_size  # here: the floor's module imports scikit-learn

    return min_cluster_size(cfg.min_cluster_size, {})


def floor_rule(cfg: RunConfig, k: int) -> FloorRule:
    """This run's rule (module table): what its method's clients send under the floor, for k clusters."""
    sums_only = cfg.secagg or cfg.dp.enabled  # only sums reach the server: moments inits
    method = cfg.method
    if method in KFED_LIKE:
        params = cfg.params(KFedConfig) if method == "kfed" else cfg.params(TextKFedConfig)
        return FloorRule(True, params.local_k or k, capped=not cfg.dp.enabled, needs_k=True)
    if method == "ffcm":
        local = cfg.params(FFCMConfig).init == "local-centres" and not sums_only
        return FloorRule(True, k if local else 0, capped=True, needs_k=local)
    if method in FSTC_LIKE:
        params = cfg.params(FSTCConfig)
        if params.init != "centres" or sums_only:
            return FloorRule()
        return FloorRule(True, params.local_centres(k), capped=True)
    if method == "fsccl":
        return FloorRule(True, cfg.params(FSCCLConfig).init_local_k or 2 * k, capped=True)
    if method == "ccfc":
        return FloorRule(True, k)
    return FloorRule()
