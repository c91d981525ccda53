#!/usr/bin/env bash
# The container deployment, end to end, from nothing (tens of minutes; not run by CI):
#   1. podman, runc, mmdebstrap (apt) and podman-compose (PyPI, into .venv) when missing;
#   2. the images of deploy/containers/Containerfile: SuperLink and SuperNode without torch, a SuperNode
#      with CPU torch and one with CUDA torch, on a local Debian base made by mmdebstrap (no image
#      registry is needed; BASE_IMAGE=flwr/supernode:1.42.0 etc. where one is reachable); sizes and build
#      times printed; the image without torch must be at most a quarter of the CUDA one;
#   3. three sites' unlabelled CSV files; k-FED (k = 0, chosen by the federation) and FFCM deployed natively
#      (`fedapp deploy`) and from the containers (`fedapp deploy --containers`, TLS + SuperNode auth, a
#      fourth SuperNode with an unregistered key): same metrics, same assignments; the fourth refused;
#   4. a SuperNode container killed mid-run: the run ends `degraded` (exit code 3);
#   5. Ctrl-C during a run: every container removed; and nothing of the deployments left (containers,
#      networks, volumes);
#   6. the base install (`pip install .`, no extra) runs the NumPy methods and refuses ccfc (pytest -m install).
# Builds run under `nice -n 15`, one at a time. FEDAPP_CONTAINERS_DIR (default /tmp/fedapp-containers)
# holds the base image's tarball, containers.conf and the runs' outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=${FEDAPP_CONTAINERS_DIR:-/tmp/fedapp-containers}
mkdir -p "$WORK"
say() { echo "[containers] $*"; }
fail() { echo "[containers] FAILED: $*" >&2; exit 1; }

# ---- 1. tools ------------------------------------------------------------------------------------------
if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v runc >/dev/null; then
  say "installing podman, runc, mmdebstrap (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >/dev/null
fi
bash scripts/setup.sh
.venv/bin/python -m pip install --quiet --disable-pip-version-check "podman-compose==1.6.0"
# podman here needs runc, cgroupfs and no default ulimits (rlimit errors otherwise); harmless elsewhere
cat > "$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
EOF
export CONTAINERS_CONF="$WORK/containers.conf" FEDAPP_COMPOSE="$ROOT/.venv/bin/podman-compose"
export PATH="$ROOT/.venv/bin:$PATH"
networks_before=$(podman network ls -q | sort | tr '\n' ' ')
volumes_before=$(podman volume ls -q | sort | tr '\n' ' ')

# ---- 2. images -----------------------------------------------------------------------------------------
BASE=${BASE_IMAGE:-localhost/fedapp-debian:bookworm}
if [ -z "${BASE_IMAGE:-}" ] && ! podman image exists "$BASE"; then
  say "base image $BASE from Debian bookworm (mmdebstrap)"
  nice -n 15 mmdebstrap --quiet --variant=apt --include=python3,python3-venv,ca-certificates,passwd \
    bookworm "$WORK/rootfs.tar"
  podman import --quiet "$WORK/rootfs.tar" "$BASE" >/dev/null
  rm -f "$WORK/rootfs.tar"
fi
# pip inside the build uses this machine's pip settings (a CA, local wheel folders and indexes), mounted
# for the build only: nothing of it stays in an image
PIP_MOUNTS=()
{
  echo "[global]"
  python3 -m pip config list 2>/dev/null | sed -n "s/^[^.]*\.\(cert\|find-links\|extra-index-url\|index-url\)='\(.*\)'$/\1 = \2/p" \
    | sed 's|^cert = .*|cert = /host-ca.crt|' | sort -u
} > "$WORK/pip.conf"
CA=$(python3 -m pip config list 2>/dev/null | sed -n "s/^[^.]*\.cert='\(.*\)'$/\1/p" | head -1)
[ -n "$CA" ] && PIP_MOUNTS+=(-v "$CA:/host-ca.crt:ro")
for folder in $(grep -o '/opt/[^ ]*' "$WORK/pip.conf" | sed 's|/simple$||' | sort -u); do
  [ -d "$folder" ] && PIP_MOUNTS+=(-v "$folder:$folder:ro")
done
PIP_MOUNTS+=(-v "$WORK/pip.conf:/etc/pip.conf:ro")
# the CPU variant: PyTorch's CPU index by default; here what the local wheel folders hold
CPU_ARGS=()
if ls /opt/wheels/torch-*+cpu-*.whl >/dev/null 2>&1; then
  CPU_SPEC="torch==$(basename /opt/wheels/torch-*+cpu-*.whl | cut -d- -f2)"  # no CPU torchvision here
  CPU_ARGS=(--build-arg "TORCH_SPEC=$CPU_SPEC" --build-arg "TORCH_INDEX_URL=https://pypi.org/simple")
fi
build() {  # ROLE TORCH TAG [extra build args]
  local role=$1 torch=$2 tag=$3 started
  shift 3
  started=$(date +%s)
  nice -n 15 podman build --quiet --format docker --network host "${PIP_MOUNTS[@]}" \
    -f deploy/containers/Containerfile --build-arg "BASE_IMAGE=$BASE" --build-arg "ROLE=$role" \
    --build-arg "TORCH=$torch" "$@" -t "$tag" . >/dev/null
  local size
  size=$(podman image inspect --format '{{.Size}}' "$tag")
  say "built $tag in $(( $(date +%s) - started )) s: $(( size / 1000000 )) MB"
  echo "$tag $(( $(date +%s) - started )) $size" >> "$WORK/images.txt"
}
: > "$WORK/images.txt"
build supernode none localhost/fedapp-supernode:none
build superlink none localhost/fedapp-superlink:none
build supernode cpu localhost/fedapp-supernode:cpu "${CPU_ARGS[@]}"
build supernode cuda localhost/fedapp-supernode:cuda
none_size=$(podman image inspect --format '{{.Size}}' localhost/fedapp-supernode:none)
cuda_size=$(podman image inspect --format '{{.Size}}' localhost/fedapp-supernode:cuda)
[ $(( 4 * none_size )) -le "$cuda_size" ] || fail "the image without torch ($none_size B) is over a quarter of the CUDA one ($cuda_size B)"
say "no torch / CUDA torch: $(python3 -c "print(f'{$none_size / $cuda_size:.2f}')")"

# ---- 3. native and container deployments of two methods on three sites' unlabelled files ---------------
SITES="$WORK/sites"
mkdir -p "$SITES"
.venv/bin/python - "$SITES" <<'EOF'
import sys
import numpy as np
import pandas as pd
from sklearn.datasets import make_blobs
X, _ = make_blobs(n_samples=600, n_features=6, centers=4, cluster_std=1.2, random_state=7)
for site, rows in enumerate(np.array_split(np.random.default_rng(7).permutation(600), 3)):
    table = pd.DataFrame(X[rows], columns=[f"f{j}" for j in range(6)])
    table.insert(0, "id", [f"rec-{i}" for i in rows])
    table.to_csv(f"{sys.argv[1]}/site-{site}.csv", index=False)  # no label column: unlabelled
EOF
DATA="csv:$SITES/site-{partition-id}.csv"
KFED=(--method kfed --node-data "$DATA" --clients 3 --rounds 2 --seed 3 --set k=0)
FFCM=(--method ffcm --node-data "$DATA" --clients 3 --rounds 4 --seed 3 --set k=4)
rm -rf "$WORK/runs"
say "native: k-FED (k = 0) and FFCM"
fedapp deploy "${KFED[@]}" --out "$WORK/runs/native-kfed"
fedapp deploy "${FFCM[@]}" --out "$WORK/runs/native-ffcm"
say "containers: k-FED with a fourth, unregistered SuperNode, and FFCM"
fedapp deploy --containers "${KFED[@]}" --unregistered-nodes 1 --out "$WORK/runs/containers-kfed" \
  | tee "$WORK/kfed-containers.txt"
grep -q "unregistered SuperNode 3: refused" "$WORK/kfed-containers.txt" || fail "the unregistered SuperNode was not refused"
fedapp deploy --containers "${FFCM[@]}" --out "$WORK/runs/containers-ffcm"
.venv/bin/python - "$WORK/runs" <<'EOF'
import json, sys
from pathlib import Path
import pandas as pd
runs = Path(sys.argv[1])
for method in ("kfed", "ffcm"):
    native, boxed = (json.loads((runs / f"{kind}-{method}" / "summary.json").read_text()) for kind in ("native", "containers"))
    assert native["metrics"] == boxed["metrics"], (method, native["metrics"], boxed["metrics"])
    assert native["k"] == boxed["k"] and native["status"] == boxed["status"], method
    for node in range(3):
        a, b = (pd.read_csv(runs / f"{kind}-{method}" / "nodes" / str(node) / "assignments.csv") for kind in ("native", "containers"))
        assert a.equals(b), (method, node)
    print(f"[containers] {method}: k={boxed['k']} {boxed['status']}, metrics and 3 nodes' assignments equal the native run")
EOF

# ---- 4. a SuperNode container killed mid-run: degraded -----------------------------------------------
say "FFCM, 8 rounds; SuperNode 2's container killed after round 2 (round-timeout 60 s bounds the wait)"
KILLED=(--method ffcm --node-data "$DATA" --clients 3 --rounds 8 --seed 3 --set k=4 --set ffcm.delta=0)
fedapp deploy --containers "${KILLED[@]}" --set round-timeout=60 \
  --out "$WORK/runs/containers-killed" > "$WORK/killed.txt" 2>&1 &
runner=$!
for _ in $(seq 600); do grep -q "round 2/" "$WORK/killed.txt" 2>/dev/null && break; sleep 1; done
grep -q "round 2/" "$WORK/killed.txt" || { kill -INT "$runner"; wait "$runner" || true; fail "no round 2"; }
podman kill "fedapp-$runner-supernode-2" >/dev/null
set +e; wait "$runner"; code=$?; set -e
cat "$WORK/killed.txt"
status=$(.venv/bin/python -c "import json; print(json.load(open('$WORK/runs/containers-killed/summary.json'))['status'])")
[ "$code" = 3 ] && [ "$status" = degraded ] || fail "killed SuperNode: exit code $code, status $status (wanted 3, degraded)"
say "killed SuperNode: exit code 3, status degraded"

# ---- 5. Ctrl-C, and nothing left behind --------------------------------------------------------------
say "Ctrl-C while the SuperNodes run"
fedapp deploy --containers "${FFCM[@]}" --out "$WORK/runs/containers-interrupted" > "$WORK/interrupted.txt" 2>&1 &
runner=$!
for _ in $(seq 300); do grep -q "flwr run" "$WORK/interrupted.txt" 2>/dev/null && break; sleep 1; done
kill -INT "$runner"
set +e; wait "$runner"; code=$?; set -e
[ "$code" = 130 ] || fail "Ctrl-C: exit code $code (wanted 130)"
left=$(podman ps -a --format '{{.Names}}' | grep '^fedapp-' || true)
[ -z "$left" ] || fail "containers left: $left"
[ "$(podman network ls -q | sort | tr '\n' ' ')" = "$networks_before" ] || fail "a network was left"
[ "$(podman volume ls -q | sort | tr '\n' ' ')" = "$volumes_before" ] || fail "a volume was left"
say "Ctrl-C: exit code 130; no container, network or volume left"

# ---- 6. the base install -----------------------------------------------------------------------------
.venv/bin/python -m pytest -q -p no:xdist -m install tests/test_dependencies.py
say "all checks passed; images: $(cut -d' ' -f1 "$WORK/images.txt" | tr '\n' ' ')"
