# lib.sh: helpers shared by the benchmark scripts that write a section of
# docs/benchmarks.md. Source it from the repository root:
#
#   . test/bench/lib.sh
#   bench_machine                      one line: cores, CPU model, kernel, date (UTC)
#   printf '%s\n' 3 1 2 | bench_spread  "2 1 3": median, min and max of numbers on stdin
#   bench_ratio 2 4                    "0.50": a / b with two decimals, "n/a" if b is 0
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
