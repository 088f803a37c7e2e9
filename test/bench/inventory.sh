#!/usr/bin/env bash
# inventory.sh: gpuboot's Register on its two inventory stores, bbolt against the
# cluster store (issue 31), written as the "inventory" section of docs/benchmarks.md
# (docs/bench/inventory.md). Both stores run in the same session, alternating which goes
# first, INVENTORY_RUNS times each. OUT=FILE writes the section there instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh

: "${INVENTORY_RUNS:=3}" "${INVENTORY_MACHINES:=300}"
export INVENTORY_RUNS INVENTORY_MACHINES
raw=$(mktemp)
section=$(mktemp)
trap 'rm -f "$raw" "$section"' EXIT
cmd="GPURACK_BENCH_INVENTORY=1 INVENTORY_RUNS=$INVENTORY_RUNS INVENTORY_MACHINES=$INVENTORY_MACHINES go test -count=1 -run '^TestInventoryRegister\$' -v ./test/invbench"
GPURACK_BENCH_INVENTORY=1 "${GO:-go}" test -count=1 -timeout 30m -v -run '^TestInventoryRegister$' ./test/invbench 2>&1 |
  grep -E '^(INVENTORY|--- |ok|FAIL)' | tee /dev/stderr >"$raw"
grep -q '^--- PASS' "$raw" || { echo "inventory: TestInventoryRegister did not pass" >&2; exit 1; }
field() { # field STORE KEY: the KEY values of the runs on STORE
  awk -v s="store=$1" -v k="$2=" '$1 == "INVENTORY" && $2 == s { for (i = 3; i <= NF; i++) if (index($i, k) == 1) print substr($i, length(k) + 1) }' "$raw"
}
spread() { field "$1" "$2" | bench_spread | awk '{ printf "%s (%s–%s)", $1, $2, $3 }'; }
median() { field "$1" "$2" | bench_spread | awk '{ print $1 }'; }
{
  echo "## inventory: gpuboot's Register on bbolt against the cluster store"
  echo
  echo "Machine: $(bench_machine). Command: \`test/bench/inventory.sh\` (\`$cmd\`)."
  echo "Conditions: gpuboot's enrollment service in the test process, over TLS gRPC on"
  echo "loopback; $INVENTORY_MACHINES first Registers of distinct machines (each recorded"
  echo "registered) from 16 clients at once, after 20 not timed. bbolt: a file on this machine's disk"
  echo "(ext4), fsync on every commit. Cluster store: Machine objects in a real apiserver"
  echo "(the pinned kube-apiserver and one etcd member, fsync on, both on this machine) with"
  echo "the enroller's credentials, its client bounded to 1000 requests a second as gpuboot's is. Everything shares two cores, so the cluster store's"
  echo "apiserver and etcd compete with gpuboot and the clients: with a control plane on"
  echo "other hosts the ratio is smaller. $INVENTORY_RUNS runs of each store, alternating"
  echo "which goes first; median (min–max) of the runs."
  echo
  echo "| | bbolt | cluster store | ratio (cluster / bbolt) |"
  echo "|---|---|---|---|"
  for k in registers_per_s p50_ms p99_ms; do
    printf '| %s | %s | %s | %s |\n' "$k" "$(spread bbolt "$k")" "$(spread cluster "$k")" "$(bench_ratio "$(median cluster "$k")" "$(median bbolt "$k")")"
  done
} >"$section"
if [ -n "${OUT:-}" ]; then mv "$section" "$OUT"; else bench_section inventory "$section"; fi
