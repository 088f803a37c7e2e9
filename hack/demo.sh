#!/usr/bin/env bash
# demo.sh: the main demo. What exists today: the profiles, their validation and the
# pinned Kubernetes binaries. Later parts (image build, PXE boot, enrollment, agent,
# control plane) extend this script as they land.
set -euo pipefail
cd "$(dirname "$0")/.."
k8s=${GPURACK_K8S_DIR:-${GPURACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpurack}/k8s/v1.34.2}

step() { printf '\n== %s\n' "$*"; }

step "1. Node profiles: one per GPU driver version, validated strictly"
bin/gpuimage lint profiles/*.yaml

step "2. A broken profile gets an error naming file, line and field"
bad=$(mktemp --suffix=.yaml)
trap 'rm -f "$bad"' EXIT
sed 's/flavor: open/flavor: opne/' profiles/debian12-nvidia535.yaml >"$bad"
bin/gpuimage lint "$bad" || true

step "3. Pinned Kubernetes and etcd binaries, built from source into $k8s"
for b in kube-apiserver kubelet kubeadm; do printf '%-16s %s\n' "$b" "$("$k8s/bin/$b" --version 2>&1 | head -1)"; done
printf '%-16s %s\n' etcd "$("$k8s/bin/etcd" --version | head -1)"
printf '%-16s %s\n' pause-image "$(cat "$k8s/images/pause.tag")"

step "Next"
echo "gpuimage build, gpuboot serve, gpuagent and controlplane-bootstrap join this demo as their issues land."
