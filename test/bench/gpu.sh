#!/usr/bin/env bash
# gpu.sh: the GPU path to pods, written as the "gpu" section of docs/benchmarks.md
# (docs/bench/gpu.md). A real kubelet and containerd on this machine (hostnode), the
# device plugin over the simulated DGX H100 and the agent's monitor:
#   - an XID 79 → the GPU out of the Node's allocatable in the apiserver, with kubelet's
#     nodeStatusUpdateFrequency as gpuagent sets it (1 s) and kubelet's default (10 s),
#     side by side in one run;
#   - kubelet's Allocate call on the plugin's socket, p50 and p99.
# Needs root, the pinned Kubernetes binaries on PATH (make deps) and containerd.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh

raw=$(mktemp)
section=$(mktemp)
trap 'rm -f "$raw" "$section"' EXIT
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
RUNS=${RUNS:-3}
cmd1="go test -run '^\$' -bench FaultToWithdrawnKubelet ./test/gpupods, $RUNS times"
cmd2="go test -run '^\$' -bench Allocate -benchmem ./agent/deviceplugin"
# One process a run (each forms its test cluster afresh), both sides in each: they alternate.
: >"$raw"
for i in $(seq 1 "$RUNS"); do
  "${GO:-go}" test -count=1 -run '^$' -bench FaultToWithdrawnKubelet -timeout 60m ./test/gpupods 2>&1 | grep -E '^(Benchmark|ok|FAIL|---)' | tee -a /dev/stderr >>"$raw"
done
"${GO:-go}" test -run '^$' -bench Allocate -benchmem ./agent/deviceplugin 2>&1 | grep -E '^(Benchmark|ok|FAIL)' | tee -a /dev/stderr >>"$raw"
metric() { # metric BENCH-PATTERN UNIT
  awk -v b="$1" -v u="$2" '$1 ~ b { for (i = 3; i <= NF; i++) if ($(i + 1) == u) print $i }' "$raw"
}
spread_s() { # BENCH-PATTERN -> "median s (min–max)" of ns/fault over the runs
  set -- $(metric "$1" ns/fault | bench_spread)
  awk -v m="$1" -v lo="$2" -v hi="$3" 'BEGIN { printf "%.2f s (%.2f–%.2f)", m / 1e9, lo / 1e9, hi / 1e9 }'
}
fast=$(metric 'status-every-1s' ns/fault | bench_spread | cut -d' ' -f1)
slow=$(metric 'status-every-10s' ns/fault | bench_spread | cut -d' ' -f1)
{
  echo "## GPU to pods: a withdrawn GPU in the apiserver, Allocate"
  echo
  echo "Machine: $(bench_machine). Command: \`make bench-gpu\` (\`$cmd1\`, \`$cmd2\`)."
  echo "Conditions: the simulator's GPUs (go-nvml mock), the agent's monitor checking every"
  echo "100 ms, a real kubelet v1.34.2 and Debian 12's containerd 1.6 on this machine, a real"
  echo "apiserver (etcd without fsync); the Node seen through a watch (no polling, no client rate"
  echo "limit in the path). Each fault is injected right after the previous recovery was posted,"
  echo "so it waits close to a whole status period: the worst case, not the average (which is"
  echo "about half). Both sides run $RUNS times, alternating; cells: median (min–max) of the runs'"
  echo "means of 5 faults, ratio of the medians; slowest: the slowest fault of all runs."
  echo
  echo "| what | gpurack (status every 1 s) | kubelet default (10 s) | ratio |"
  echo "|---|---|---|---|"
  printf '| XID 79 → allocatable −1 in the apiserver, mean of 5 | %s | %s | %s |\n' \
    "$(spread_s 'status-every-1s')" "$(spread_s 'status-every-10s')" "$(bench_ratio "$slow" "$fast")"
  printf '| the same, slowest | %s ms | %s ms | |\n' "$(metric 'status-every-1s' max-ms | sort -g | tail -1)" "$(metric 'status-every-10s' max-ms | sort -g | tail -1)"
  echo
  echo "| Allocate over the plugin's socket (2 of 8 GPUs) | p50 | p99 | B/op |"
  echo "|---|---|---|---|"
  printf '| gpuagent device plugin | %s µs | %s µs | %s |\n' \
    "$(awk -v v="$(metric Allocate p50-ns)" 'BEGIN { printf "%.0f", v / 1000 }')" \
    "$(awk -v v="$(metric Allocate p99-ns)" 'BEGIN { printf "%.0f", v / 1000 }')" "$(metric Allocate B/op)"
  echo
  echo "No peer plugin is measured beside Allocate: NVIDIA's k8s-device-plugin is not served"
  echo "by the module proxy here."
} >"$section"
bench_section gpu "$section"
