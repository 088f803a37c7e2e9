#!/usr/bin/env bash
# rack.sh: the simulated rack (hack/rack-demo.sh, what make demo runs) at RACKS nodes
# (default "20 100"), written as the "rack" section of docs/benchmarks.md
# (docs/bench/rack.md): time from power-on until every machine is validated and ready
# (or quarantined), and gpuboot's CPU time and peak memory over that storm. Every node
# is a real gpuagent process with the GPU simulator against the real gpuboot and
# control plane, so the machine's cores are shared by all of them. Needs make build
# and make deps; each size runs once, then its demo is cleaned up.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
RACKS=${RACKS:-20 100}
section=$(mktemp)
rows=$(mktemp)
trap 'rm -f "$section" "$rows"' EXIT
for n in $RACKS; do
  dir=$(mktemp -d)
  log=$(mktemp)
  echo "rack bench: $n nodes (log $log)" >&2
  if ! DEMO_DIR="$dir/demo" NODES=$n DEMO_TIMEOUT=1800 hack/rack-demo.sh >"$log" 2>&1; then
    tail -20 "$log" >&2
    DEMO_DIR="$dir/demo" hack/rack-demo.sh clean >/dev/null 2>&1 || true
    exit 1
  fi
  t=$(sed -n 's/^all [0-9]* machines commissioned in \([0-9.]*\) s from power-on.*/\1/p' "$log")
  cpu=$(sed -n 's/^gpuboot during the enrollment storm: \([0-9.]*\) s of CPU.*/\1/p' "$log")
  hwm=$(sed -n 's/.*peak RSS \([0-9?]*\) MiB.*/\1/p' "$log")
  totals=$(grep -oE '"(nodesReady|nodesQuarantined|gpusAllocatable)": [0-9]+' "$dir/demo/rack-r1.json" 2>/dev/null | tr -d '"' | paste -sd ' ' || true)
  printf '| %d × 8 | %s s | %s s | %s MiB | %s |\n' "$n" "$t" "$cpu" "$hwm" "${totals:-}" >>"$rows"
  DEMO_DIR="$dir/demo" hack/rack-demo.sh clean >/dev/null 2>&1 || true
  rm -rf "$dir" "$log"
done
{
  echo "## Rack: a simulated rack from power-on to commissioned"
  echo
  echo "Machine: $(bench_machine). Command: \`make bench-rack\` (\`test/bench/rack.sh\`, which runs"
  echo "\`hack/rack-demo.sh\`, the main demo, at each size). Conditions: every node a real"
  echo "gpuagent process (GPU simulator, checks every 10 s) enrolling with the real gpuboot"
  echo "(allowlist approval) and joining the real control plane (docs/examples/cluster.yaml) by"
  echo "TLS bootstrap, all on this machine; etcd and gpuboot's inventory write with fsync. All"
  echo "machines call from 127.0.0.1, so the demo scales gpuboot's per-source limit on Register"
  echo "and Heartbeat to the rack (enrollment.sourceRate 5/s and sourceBurst 50 per machine, as"
  echo "one address per machine would get; with the default, 100 machines sharing one address"
  echo "took 137 s). One run per size. The issue's target for 20 × 8 on 2 cores is 60 s."
  echo
  echo "| rack | power-on → all ready or quarantined | gpuboot CPU over that | gpuboot peak RSS | rack report totals |"
  echo "|---|---|---|---|---|"
  cat "$rows"
} >"$section"
bench_section rack "$section"
