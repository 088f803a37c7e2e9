#!/usr/bin/env bash
# enrollflood.sh: gpuboot under a flood of unauthenticated Registers (issue 33),
# written as the "enrollflood" section of docs/benchmarks.md (docs/bench/enrollflood.md).
#   - the p50 and p99 of a bound machine's Register and Heartbeat with no flood and
#     under FLOOD_RATE unauthenticated Registers a second (random identities, a fresh
#     key each) from FLOOD_SOURCES loopback addresses, in one run against one real
#     gpuboot, quiet and flood phases alternating, FLOOD_RUNS of each;
#   - gpuboot's RSS once unapproved records fill enrollment.maxUnapprovedBytes (default
#     64 MiB) with the largest facts and checklist an agent may send.
# The flood client runs on the same machine as gpuboot, so on few cores it takes CPU
# from it and may not reach FLOOD_RATE: the section states the rate reached.
# OUT=FILE writes the section there instead and leaves docs/ alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh

: "${FLOOD_RATE:=5000}" "${FLOOD_SOURCES:=100}" "${FLOOD_SECONDS:=8}" "${FLOOD_RUNS:=3}"
export FLOOD_RATE FLOOD_SOURCES FLOOD_SECONDS FLOOD_RUNS
raw=$(mktemp)
section=$(mktemp)
trap 'rm -f "$raw" "$section"' EXIT
cmd="GPURACK_BENCH_FLOOD=1 FLOOD_RATE=$FLOOD_RATE FLOOD_SOURCES=$FLOOD_SOURCES FLOOD_SECONDS=$FLOOD_SECONDS FLOOD_RUNS=$FLOOD_RUNS go test -count=1 -timeout 30m -run '^TestFloodLatency\$' ./pxe/server"
GPURACK_BENCH_FLOOD=1 "${GO:-go}" test -count=1 -timeout 30m -v -run '^TestFloodLatency$' ./pxe/server 2>&1 |
  grep -E '^(FLOOD|RSSCAP|--- |ok|FAIL)' | tee /dev/stderr >"$raw"
grep -q '^--- PASS' "$raw" || { echo "enrollflood: TestFloodLatency did not pass" >&2; exit 1; }
field() { # field PHASE KEY: the KEY values of PHASE's lines, one a line
  awk -v p="phase=$1" -v k="$2=" '$1 == "FLOOD" { ok = 0; for (i = 2; i <= NF; i++) if ($i == p) ok = 1
    if (ok) for (i = 2; i <= NF; i++) if (index($i, k) == 1) print substr($i, length(k) + 1) }' "$raw"
}
spread() { field "$1" "$2" | bench_spread | awk '{ printf "%s (%s–%s)", $1, $2, $3 }'; }
median() { field "$1" "$2" | bench_spread | awk '{ print $1 }'; }
rss() { awk -v k="$1=" '$1 == "RSSCAP" { for (i = 2; i <= NF; i++) if (index($i, k) == 1) print substr($i, length(k) + 1) }' "$raw"; }
{
  echo "## Enrollment under a flood of unauthenticated Registers"
  echo
  echo "Machine: $(bench_machine). Command: \`test/bench/enrollflood.sh\` (\`$cmd\`)."
  echo "Conditions: one real \`gpuboot serve\` on loopback (bbolt inventory with fsync),"
  echo "enrollment.sourceRate 50/s per address; a bound machine (approved, its agent"
  echo "certificate fetched) makes 20 Registers and 20 mTLS Heartbeats a second from 127.0.0.1"
  echo "while a flood client on the same machine sends Registers with random identities, a"
  echo "fresh key each, from $FLOOD_SOURCES addresses of 127.0.0.0/8, aiming at $FLOOD_RATE a"
  echo "second. Quiet and flood phases of $FLOOD_SECONDS s alternate, $FLOOD_RUNS of each; median"
  echo "(min–max) of the phases. The flood rate is the calls answered per second, what the"
  echo "client reached, not what it aimed at."
  echo
  echo "| bound machine | no flood | under the flood | ratio of medians |"
  echo "|---|---|---|---|"
  for call in register heartbeat; do
    for p in p50 p99; do
      printf '| %s %s | %s ms | %s ms | %s |\n' "$call" "$p" "$(spread quiet "${call}_${p}_ms")" "$(spread flood "${call}_${p}_ms")" \
        "$(bench_ratio "$(median flood "${call}_${p}_ms")" "$(median quiet "${call}_${p}_ms")")"
    done
  done
  printf '| flood reached (Registers/s) | | %s | |\n' "$(spread flood flood_per_s)"
  echo
  echo "gpuboot at the byte cap on unapproved records (enrollment.maxUnapprovedBytes, 64 MiB):"
  echo "$(rss records) strangers with the largest facts (64 KiB) and checklist (256 KiB) stored"
  echo "before the next was refused; VmRSS $(rss rss_start_mib) MiB before, $(rss rss_mib) MiB after, peak $(rss peak_mib) MiB."
} >"$section"
if [ -n "${OUT:-}" ]; then mv "$section" "$OUT"; else bench_section enrollflood "$section"; fi
