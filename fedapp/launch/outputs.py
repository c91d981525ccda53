"""What a run writes into its output folder, so that a new run never lies beside an earlier one's files.

A run into a folder that holds an earlier run's outputs would leave that run's `nodes/7/` beside a new
2-client run's `nodes/0..1/`, its `model/model.npz` beside a new `model.safetensors`. Before any process
starts, such a folder is refused unless the run resumes (`resume = true`: the earlier run *is* this one)
or the user asks to `--overwrite`: then exactly the files named here are removed first, and the folders
they leave empty — never a file fedapp does not write, so a folder shared with other files keeps them.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from fedapp.app.checkpoint import checkpoint_dir
from fedapp.app.preflight import check_out_dir
from fedapp.config.run import ConfigError, RunConfig
from fedapp.datasets import PARTITION_PLACEHOLDER
from fedapp.report.assignments import ASSIGNMENTS_FILE
from fedapp.report.model_store import MODEL_DIR, MODEL_JSON, NPZ_FILE, SAFETENSORS_FILE
from fedapp.report.pages.node import NODE_DATA, NODE_PAGE
from fedapp.report.pages.run import REPORT_FILE
from fedapp.report.selection_files import TUNE_JSON, TUNE_PNG

# the run's own files in its folder: records, log, wire bytes (server_loop.WIRE_BYTES_FILE), CCFC's global
# model (strategies.ccfc.MODEL_FILE), a loopback deployment's pids, k = 0's selection (simulation.tune),
# the run's page (fedapp.report.pages.run)
# (tests/test_outputs.py keeps them in step)
RUN_FILES = (
    "summary.json",
    "rounds.json",
    "metrics.png",
    "flower.log",
    "wire_bytes.json",
    "global_model.npz",
    "deploy-pids.json",
    TUNE_JSON,
    TUNE_PNG,
    REPORT_FILE,
)
NODE_FILES = (ASSIGNMENTS_FILE, NODE_PAGE, NODE_DATA)  # what a node writes into its folder
MODEL_FILES = (MODEL_JSON, NPZ_FILE, SAFETENSORS_FILE)
CHECKPOINT_FILES = ("latest.json", "strategy-round-*.pkl", "client-*-round-*.recorddict")
SHOWN = 3  # outputs named in the refusal; the rest are counted


def earlier_outputs(cfg: RunConfig) -> list[Path]:
    """The files of an earlier run that this run would write or lie beside: its folder's records and
    model, every node folder's assignments and page (`node-out-dir`, any partition id) and its
    checkpoints."""
    out = Path(cfg.out_dir)
    found = [out / name for name in RUN_FILES] + [out / MODEL_DIR / name for name in MODEL_FILES]
    found += node_outputs(cfg.node_out_dir)
    checkpoints = checkpoint_dir(cfg, out)
    found += [path for pattern in CHECKPOINT_FILES for path in sorted(checkpoints.glob(pattern))]
    return [path for path in found if path.is_file()]


def node_outputs(node_out_dir: str) -> list[Path]:
    """Every partition's files (NODE_FILES) under a `node-out-dir` that holds `{partition-id}`."""
    if not node_out_dir:
        return []
    parts = node_out_dir.split(PARTITION_PLACEHOLDER)
    if len(parts) == 1:
        return [Path(node_out_dir) / name for name in NODE_FILES]
    own = re.compile(r"\d+".join(re.escape(part) for part in parts))
    found = []
    for name in NODE_FILES:
        pattern = "*".join(glob.escape(part) for part in parts) + f"/{name}"
        found += [Path(match) for match in glob.glob(pattern) if own.fullmatch(str(Path(match).parent))]
    return sorted(found)


def check_outputs(cfg: RunConfig, *, overwrite: bool) -> None:
    """Refuse a folder holding an earlier run's outputs, unless resumed or overwritten (one line)."""
    if overwrite and cfg.resume:
        raise ConfigError("--overwrite with resume=true would delete the checkpoint the run resumes from")
    if overwrite or cfg.resume:
        return
    found = earlier_outputs(cfg)
    if found:
        listing = describe(found, Path(cfg.out_dir))
        raise ConfigError(
            f"output folder {cfg.out_dir} holds an earlier run's outputs ({listing}): "
            "add --overwrite to replace them (only fedapp's own files are removed), set resume=true to "
            "continue that run, or choose another folder"
        )


def check_selection_outputs(out_dir: Path, *, overwrite: bool) -> None:
    """`fedapp tune`'s outputs, checked before the selection runs, as a run's are: an earlier tune.json /
    tune.png is refused unless `overwrite`, and the folder must be one the results can be written to."""
    earlier = [out_dir / name for name in (TUNE_JSON, TUNE_PNG) if (out_dir / name).exists()]
    if earlier and not overwrite:
        raise ConfigError(f"{out_dir} holds an earlier {earlier[0].name}: pass --overwrite or another --out")
    check_out_dir(out_dir)


def describe(paths: list[Path], out: Path) -> str:
    """The first few outputs, relative to the folder where they are under it, and how many in all."""
    shown = [str(p.relative_to(out)) if p.is_relative_to(out) else str(p) for p in paths[:SHOWN]]
    more = f", ... {len(paths)} files" if len(paths) > SHOWN else ""
    return ", ".join(shown) + more


def clear_outputs(cfg: RunConfig) -> list[Path]:
    """`--overwrite`: remove the earlier run's files (`earlier_outputs`), then the folders that left empty
    (node folders, nodes/, model/, checkpoint/; never the output folder itself). Returns what was removed."""
    removed = earlier_outputs(cfg)
    for path in removed:
        path.unlink(missing_ok=True)
    out = Path(cfg.out_dir)
    folders = {path.parent for path in removed} | {out / "nodes", out / MODEL_DIR}
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        if folder != out and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return removed
