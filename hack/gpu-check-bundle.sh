#!/usr/bin/env bash
# Builds what hack/gpu-check.sh runs on a machine with an NVIDIA GPU, gzipped into
# bin/gpu-check/ (or $1): gpuagent, the device plugin's test binary and nvidia-ctk from
# the pinned toolkit module, each with cgo (go-nvml dlopens libnvidia-ml). The bundle
# travels with the working tree to that machine, which has no Go toolchain, so it must
# stay under 64 MiB with the tree.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$repo/bin/gpu-check}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
cd "$repo"
go build -trimpath -ldflags "-s -w" -o "$work/gpuagent" ./agent/cmd/gpuagent
go test -c -trimpath -ldflags "-s -w" -o "$work/deviceplugin.test" ./agent/deviceplugin
go build -trimpath -ldflags "-s -w" -o "$work/nvidia-ctk" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk
mkdir -p "$out"
total=0
for f in gpuagent deviceplugin.test nvidia-ctk; do
  gzip -9 -n -c "$work/$f" >"$out/$f.gz"
  size=$(stat -c %s "$out/$f.gz")
  total=$((total + size))
  printf '%-20s %6d KiB (gzip of %d KiB)\n' "$f.gz" $((size / 1024)) $(($(stat -c %s "$work/$f") / 1024))
done
printf '%-20s %6d KiB in %s\n' total $((total / 1024)) "$out"
if [ "$total" -gt $((56 * 1024 * 1024)) ]; then
  echo "gpu-check bundle: $((total / 1024 / 1024)) MiB leaves too little of the 64 MiB a device run carries" >&2
  exit 1
fi
