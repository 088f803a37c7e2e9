#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU and driver, for a machine without a Go
# toolchain: run hack/gpu-check-bundle.sh (make gpu-check-bundle) where Go is, carry
# bin/gpu-check/ with the tree, then run this there. It prints every step's output and
# a summary, and exits 1 if a required step failed.
#
#   1. gpuagent validate --gpu-backend nvml: the commissioning checklist on these GPUs
#      against a shipped profile (informational: the profile need not describe the
#      machine, so FAILs for driver version or GPU count are expected and say so);
#   2. gpuagent cdi generate: the CDI spec the device plugin writes (nvcdi), validated
#      by the CDI library; required;
#   3. nvidia-ctk cdi list over that spec (the toolkit's own reading of it), and
#      nvidia-ctk cdi generate beside it: the device names must match; required;
#   4. the device plugin over NVML against a kubelet-side registration stub
#      (agent/deviceplugin TestPluginOnNVML); required;
#   5. gpuagent compute-check: PTX kernels through libcuda on every GPU (SGEMM verified
#      against the CPU, device-memory and host<->device bandwidth), printed as text and
#      as JSON; required (a wrong result or a GPU that cannot run a kernel fails it).
#      Its figures go into docs/benchmarks.md ("GPU compute check").
#
# GPURACK_GPU_CHECK_PROFILE picks the profile (default profiles/debian13-nvidia550.yaml);
# NVIDIA libraries are looked for in /usr/local/nvidia/lib64 first, then the loader's path.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bundle=${1:-$repo/bin/gpu-check}
profile=${GPURACK_GPU_CHECK_PROFILE:-$repo/profiles/debian13-nvidia550.yaml}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for f in gpuagent deviceplugin.test nvidia-ctk; do
  if ! gunzip -c "$bundle/$f.gz" >"$work/$f" 2>/dev/null; then
    echo "gpu-check: no $bundle/$f.gz; build the bundle with make gpu-check-bundle where Go is" >&2
    exit 2
  fi
  chmod +x "$work/$f"
done
if [ -d /usr/local/nvidia/lib64 ]; then
  export LD_LIBRARY_PATH=/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
nvml=()
for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu; do
  if [ -e "$d/libnvidia-ml.so.1" ]; then
    nvml=(--nvml-library "$d/libnvidia-ml.so.1")
    export GPURACK_NVML_LIBRARY=$d/libnvidia-ml.so.1
    break
  fi
done
export GPURACK_GPU_CHECK_PROFILE=$profile
cuda=()
for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu; do
  if [ -e "$d/libcuda.so.1" ]; then
    cuda=(--cuda-library "$d/libcuda.so.1")
    break
  fi
done

summary=()
step() { # step NAME required|info CMD...
  local name=$1 kind=$2
  shift 2
  echo "=== $name: $*"
  local t0=$(date +%s%N)
  "$@"
  local rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  echo "=== $name: exit $rc, ${ms} ms"
  local verdict=PASS
  if [ "$rc" != 0 ]; then
    if [ "$kind" = required ]; then verdict=FAIL; else verdict="exit $rc (informational)"; fi
  fi
  summary+=("$name: $verdict (${ms} ms)")
}

echo "gpu-check on $(hostname) at $(date -u +%FT%TZ); profile $profile"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,uuid,driver_version,pci.bus_id --format=csv
fi
step validate info "$work/gpuagent" validate --gpu-backend nvml "${nvml[@]}" --profile "$profile" --kmsg off
step cdi-generate required "$work/gpuagent" cdi generate "${nvml[@]}" --profile "$profile" --output "$work/cdi"
compare_cdi() {
  "$work/nvidia-ctk" --quiet cdi list --spec-dir "$work/cdi" | sort >"$work/ours.txt" || return 1
  echo "nvidia-ctk reads gpuagent's spec: $(wc -l <"$work/ours.txt") devices"
  "$work/nvidia-ctk" cdi generate --output "$work/ctk/nvidia.yaml" >"$work/ctk.log" 2>&1 || { cat "$work/ctk.log"; return 1; }
  "$work/nvidia-ctk" --quiet cdi list --spec-dir "$work/ctk" | sort >"$work/theirs.txt" || return 1
  echo "nvidia-ctk's own spec: $(wc -l <"$work/theirs.txt") devices"
  diff -u "$work/theirs.txt" "$work/ours.txt" && echo "device names match"
}
step cdi-toolkit required compare_cdi
device_plugin() { # a skip (no NVML) is a failure here
  (cd "$repo/agent/deviceplugin" && "$work/deviceplugin.test" -test.run '^TestPluginOnNVML$' -test.v -test.count 1) | tee "$work/dp.log"
  grep -q -- '--- PASS: TestPluginOnNVML' "$work/dp.log"
}
step device-plugin required device_plugin
step compute-check required "$work/gpuagent" compute-check "${cuda[@]}"
step compute-check-json info "$work/gpuagent" compute-check "${cuda[@]}" --format json

echo "=== summary"
failed=0
for s in "${summary[@]}"; do
  echo "$s"
  case $s in *": FAIL"*) failed=1 ;; esac
done
exit $failed
