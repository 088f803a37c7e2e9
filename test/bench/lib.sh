# lib.sh: helpers shared by the benchmark scripts that write a section of
# docs/benchmarks.md. Source it from the repository root:
#
#   . test/bench/lib.sh
#   bench_machine                      one line: cores, CPU model, kernel, date (UTC)
#   printf '%s\n' 3 1 2 | bench_spread  "2 1 3": median, min and max of numbers on stdin
#   bench_ratio 2 4                    "0.50": a / b with two decimals, "n/a" if b is 0
#   bench_testrack node 3 VAR FILE DIR runs TestRack 3 times with VAR=FILE (the test
#                                      appends its figures there), logs in DIR
#   bench_commit                       the short commit, "+ local changes" when dirty
#   bench_section pxe FILE             installs FILE as docs/bench/pxe.md and reassembles
#                                      docs/benchmarks.md (test/bench/benchdoc.sh)
#
# A section is one Markdown file under docs/bench/ that starts with a "## " heading and
# states its own machine line and commands; benchdoc.sh puts the sections together.

# bench_machine prints the machine a figure was measured on: core count, CPU model and
# kernel release (never a host name or path), and the date in UTC.
bench_machine() {
  local model
  model=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null)
  printf '%s cores (nproc), %s, Linux %s, %s\n' "$(nproc)" "${model:-unknown CPU}" "$(uname -r)" "$(date -u '+%Y-%m-%d %H:%M UTC')"
}

# bench_spread reads numbers, one a line, and prints "median min max" (the median of an
# even count is the mean of the middle two).
bench_spread() {
  sort -g | awk '{ v[NR] = $1 }
    END {
      if (NR == 0) { print "n/a n/a n/a"; exit }
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "%.4g %.4g %.4g\n", m, v[1], v[NR]
    }'
}

# bench_ratio prints a / b with two decimals.
bench_ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.2f\n", a / b; else print "n/a" }'
}

# bench_section NAME FILE copies FILE to docs/bench/NAME.md, removes FILE, and
# reassembles docs/benchmarks.md from every section.
bench_section() {
  mkdir -p docs/bench
  cat "$2" >"docs/bench/$1.md"
  rm -f "$2"
  test/bench/benchdoc.sh
}

# bench_testrack NAME RUNS VAR FILE DIR runs TestRack (test/qemu) RUNS times with the
# environment variable VAR set to FILE, where the test appends its figures; each run's
# log goes to DIR/run-N.log, and a failed run prints its tail and returns 1.
bench_testrack() {
  local name=$1 runs=$2 var=$3 file=$4 logs=$5 i
  for i in $(seq 1 "$runs"); do
    echo "$name bench: run $i of $runs (TestRack)" >&2
    env GPURACK_NETNS_REQUIRED=1 "$var=$file" go test -count=1 -timeout 70m -run 'TestRack$' ./test/qemu/ >"$logs/run-$i.log" 2>&1 ||
      { tail -50 "$logs/run-$i.log" >&2; echo "$name bench: run $i failed (log above)" >&2; return 1; }
  done
}

# bench_commit prints the short commit of the tree, with "+ local changes" when it
# differs from it.
bench_commit() {
  local commit
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  git diff --quiet HEAD -- 2>/dev/null || commit="$commit + local changes"
  echo "$commit"
}
