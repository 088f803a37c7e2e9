#!/usr/bin/env bash
# go.sh: every Go benchmark of the module (go test -bench), written as the "go" section
# of the benchmark table, docs/bench/go.md, which reassembles docs/benchmarks.md.
# PKGS (default ./...) and BENCH (default .) narrow it down. Go benchmarks have no peer
# measured beside them; sections comparing with one come from their own scripts.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh

PKGS=${PKGS:-./...}
BENCH=${BENCH:-.}
raw=$(mktemp)
section=$(mktemp)
trap 'rm -f "$raw" "$section"' EXIT

cmd="go test -run '^\$' -bench '$BENCH' -benchmem $PKGS"
"${GO:-go}" test -run '^$' -bench "$BENCH" -benchmem $PKGS | tee /dev/stderr >"$raw"
{
  echo "## Go benchmarks"
  echo
  echo "Machine: $(bench_machine). Command: \`make bench-go\` (\`$cmd\`); one run each, as"
  echo "\`go test\` chooses the iteration count."
  echo
  echo "| package | benchmark | time/op | B/op | allocs/op | other |"
  echo "|---|---|---|---|---|---|"
  awk '
    /^pkg: / { pkg = $2 }
    /^Benchmark/ {
      t = ""; b = ""; a = ""; o = ""
      for (i = 3; i < NF; i += 2) {
        if ($(i + 1) == "ns/op") t = $i " ns"
        else if ($(i + 1) == "B/op") b = $i
        else if ($(i + 1) == "allocs/op") a = $i
        else o = o (o == "" ? "" : ", ") $i " " $(i + 1)
      }
      name = $1; sub(/-[0-9]+$/, "", name)
      printf "| %s | %s | %s | %s | %s | %s |\n", pkg, name, t, b, a, o
    }' "$raw"
} >"$section"
bench_section go "$section"
