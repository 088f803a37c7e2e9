#!/usr/bin/env bash
# etcd.sh: etcd's write latency with 3 members against 1 (issue 31), written as the
# "etcd" section of docs/benchmarks.md (docs/bench/etcd.md). Both cluster sizes run in
# the same session, alternating which goes first, ETCD_RUNS times each.
# OUT=FILE writes the section there instead and leaves docs/ alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh

: "${ETCD_RUNS:=3}" "${ETCD_PUTS:=500}"
export ETCD_RUNS ETCD_PUTS
raw=$(mktemp)
section=$(mktemp)
trap 'rm -f "$raw" "$section"' EXIT
cmd="GPURACK_BENCH_ETCD=1 ETCD_RUNS=$ETCD_RUNS ETCD_PUTS=$ETCD_PUTS go test -count=1 -run '^TestEtcdWriteLatency\$' -v ./test/etcdbench"
GPURACK_BENCH_ETCD=1 "${GO:-go}" test -count=1 -timeout 30m -v -run '^TestEtcdWriteLatency$' ./test/etcdbench 2>&1 |
  grep -E '^(ETCD|--- |ok|FAIL)' | tee /dev/stderr >"$raw"
grep -q '^--- PASS' "$raw" || { echo "etcd: TestEtcdWriteLatency did not pass" >&2; exit 1; }
field() { # field MEMBERS KEY: the KEY values of the runs with MEMBERS members
  awk -v m="members=$1" -v k="$2=" '$1 == "ETCD" && $2 == m { for (i = 3; i <= NF; i++) if (index($i, k) == 1) print substr($i, length(k) + 1) }' "$raw"
}
spread() { field "$1" "$2" | bench_spread | awk '{ printf "%s (%s–%s)", $1, $2, $3 }'; }
median() { field "$1" "$2" | bench_spread | awk '{ print $1 }'; }
{
  echo "## etcd: write latency with 3 members against 1"
  echo
  echo "Machine: $(bench_machine). Command: \`test/bench/etcd.sh\` (\`$cmd\`)."
  echo "Conditions: the pinned etcd (v3.6.16), every member a process on this machine's"
  echo "loopback over plain HTTP, its data directory on this machine's disk (ext4) with"
  echo "etcd's fsync on; one client (etcd's Go client, endpoints all members) making"
  echo "$ETCD_PUTS sequential Puts of 1 KiB after 50 not timed; $ETCD_RUNS runs of each size,"
  echo "alternating which goes first; median (min–max) of the runs. The three members share"
  echo "one disk and two cores, unlike three hosts: their fsyncs and raft messages compete,"
  echo "so the ratio is an upper bound on what three hosts with their own disks would see."
  echo "A write commits after an fsync on a majority; on this machine's virtual disk an fsync"
  echo "returns in well under a millisecond (the 1-member p50 includes one), so the absolute"
  echo "figures are far below a disk whose fsync takes milliseconds: the ratio is what carries over."
  echo
  echo "| | 1 member | 3 members | ratio (3 / 1) |"
  echo "|---|---|---|---|"
  for k in p50_ms p99_ms puts_per_s; do
    printf '| %s | %s | %s | %s |\n' "$k" "$(spread 1 "$k")" "$(spread 3 "$k")" "$(bench_ratio "$(median 3 "$k")" "$(median 1 "$k")")"
  done
} >"$section"
if [ -n "${OUT:-}" ]; then mv "$section" "$OUT"; else bench_section etcd "$section"; fi
