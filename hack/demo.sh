#!/usr/bin/env bash
# demo.sh: the main demo, run by `make demo` after deps and build. It walks the parts a
# platform engineer meets when adding a rack, on this one machine, and cleans up after
# itself. DEMO_FAST=1 skips the image build (about 5 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
k8s=${GPURACK_K8S_DIR:-${GPURACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpurack}/k8s/v1.34.2}
export PATH="$PWD/bin:$k8s/bin:$PATH"
work=$(mktemp -d /tmp/gpurack-demo.XXXXXX)
cleanup() {
  controlplane-bootstrap stop --dir "$work/cp" >/dev/null 2>&1 || true
  [ -n "${cp_pid:-}" ] && kill "$cp_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. Node profiles, one per GPU driver version, each with its lock file"
gpuimage lint profiles/*.yaml

step "2. A broken profile gets FILE:LINE: FIELD and what to fix"
sed 's/flavor: open/flavor: opne/' profiles/debian12-nvidia535.yaml >"$work/broken.yaml"
gpuimage lint "$work/broken.yaml" || echo "(exit status $?)"

step "3. Pinned Kubernetes $("$k8s/bin/kube-apiserver" --version | cut -d' ' -f2) and etcd, built from source into the cache"
for b in kube-apiserver kubelet etcd; do printf '  %-16s %s\n' "$b" "$("$k8s/bin/$b" --version 2>&1 | sed -n 1p)"; done
printf '  %-16s %s\n' kubeadm "$("$k8s/bin/kubeadm" version -o short)"

step "4. gpuagent's commissioning checklist on a simulated 8x H100 node"
gpuagent validate --gpu-backend sim:dgxh100 --profile profiles/debian12-nvidia535.yaml | tail -4

step "5. The same node with an XID 79 on GPU 3 and a downtrained PCIe link on GPU 1"
gpuagent validate --gpu-backend sim:dgxh100 --profile profiles/debian12-nvidia535.yaml \
  --fault xid:79@gpu3 --fault pcie-width:8@gpu1 2>/dev/null | grep -E '^(FAIL|WARN)|^overall' || echo "(exit status 1: the node fails commissioning)"

step "6. A Kubernetes control plane from the pinned binaries, with kubeadm-compatible join material"
sed -e 's/port: 6443/port: 26443/; s/:6443/:26443/; s/clientPort: 2379/clientPort: 22379/; s/peerPort: 2380/peerPort: 22380/' \
    -e 's/metricsPort: 2381/metricsPort: 22381/; s/port: 10257/port: 30257/; s/port: 10259/port: 30259/' \
    docs/examples/cluster.yaml >"$work/cluster.yaml"
controlplane-bootstrap init --config "$work/cluster.yaml" --dir "$work/cp" --foreground >"$work/cp.log" 2>&1 &
cp_pid=$!
for _ in $(seq 1 120); do grep -q '^ready in' "$work/cp.log" && break; kill -0 "$cp_pid" 2>/dev/null || { cat "$work/cp.log"; exit 1; }; sleep 1; done
grep -A5 '^COMPONENT' "$work/cp.log"
token=$(controlplane-bootstrap token create --dir "$work/cp")
echo "  bootstrap token for a new node: $token"
controlplane-bootstrap join-config --dir "$work/cp" --out "$work/join"

step "7. gpuboot's CA, server certificate, rack gossip key and first operator"
gpuboot init --state-dir "$work/gpuboot" --advertise 127.0.0.1 --rack r1

if [ "${DEMO_FAST:-0}" != 1 ]; then
  step "8. A reproducible, signed netboot image of the tiny profile (a few minutes)"
  gpuimage keygen "$work/sign.pem" "$work/sign.pub.pem"
  gpuimage build profiles/tiny.yaml --agent-unit agent/systemd/gpuagent.service --out "$work/images" --key "$work/sign.pem"
  img=$(ls "$work/images" | sed -n 1p)
  gpuimage verify "$work/images/$img" --pubkey "$work/sign.pub.pem"
  gpuimage inspect "$work/images/$img" | sed -n 1,20p
fi

step "Done"
echo "Next: boot machines from the image with gpuboot serve (docs/pxe.md), enroll and approve them (docs/enrollment.md)."
