#!/usr/bin/env bash
# node.sh: what a booted node costs a workload, on the QEMU node (make bench-node).
#
# Runs TestRack (test/qemu) RUNS times; each run boots the tiny image (built once, then
# taken from the image cache) and the simulated GPU image under QEMU TCG, joins them to a
# real control plane and runs the probe pods on the tiny node. The
# test appends its figures (GPURACK_NODE_FIGURES) and this script writes the "node"
# section of docs/benchmarks.md: kubelet's Node registration to Ready, pod create to
# container start for a preloaded image, and the TCP connect time through the
# kubernetes Service's ClusterIP (the Service's first packet, kube-proxy nftables DNAT)
# against the same connect straight to the endpoint, from the same pod (the peer); and
# NetworkPolicy enforcement: the connect time to a policy-selected pod against one no
# policy selects, and how long a policy change takes to be enforced.
#
#   test/bench/node.sh             three boots (RUNS=3, as make bench-node; about 8 min each on 2 cores)
#   RUNS=1 test/bench/node.sh      one boot: each cell then says n= and no spread is claimed
#   OUT=FILE test/bench/node.sh    write the section to FILE instead of docs/bench/
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
RUNS=${RUNS:-3}
OUT=${OUT:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
figures=$work/figures.tsv
bench_testrack node "$RUNS" GPURACK_NODE_FIGURES "$figures" "$work" || exit 1
if [ ! -s "$figures" ]; then
  echo "node bench: the runs wrote no figures (TestRack writes them once its probe pod has run)" >&2
  exit 1
fi
commit=$(bench_commit)
ms() { # NAME -> "median (min–max), n=N" in ms, or in s when the median is a second or more; one sample: "value, n=1"
  local n
  n=$(awk -F'\t' -v n="$1" '$1 == n' "$figures" | wc -l)
  set -- $(awk -F'\t' -v n="$1" '$1 == n { printf "%.6f\n", $2 }' "$figures" | bench_spread)
  awk -v m="$1" -v lo="$2" -v hi="$3" -v n="$n" 'BEGIN {
    if (m == "n/a") { print "n/a"; exit }
    u = "ms"; f = 1000; d = 2
    if (m >= 1) { u = "s"; f = 1; d = 1 }
    if (n == 1) printf "%.*f %s, n=1\n", d, m * f, u
    else printf "%.*f %s (%.*f–%.*f), n=%d\n", d, m * f, u, d, lo * f, d, hi * f, n }'
}
median() { awk -F'\t' -v n="$1" '$1 == n { print $2 * 1000 }' "$figures" | bench_spread | cut -d' ' -f1; }
section=$(mktemp)
{
  echo "## Node: Ready, pod start and the Service's first packet on the QEMU node"
  echo
  echo "Machine: $(bench_machine)."
  echo "Command: \`make bench-node\` (test/bench/node.sh, RUNS=$RUNS), commit $commit: TestRack"
  echo "boots the tiny image (QEMU -accel tcg, 2 vCPUs, 2 GiB, PXE on a bridge, beside a simulated GPU node) against a real"
  echo "control plane and gpuboot in a network namespace. Emulated CPUs: the figures are far"
  echo "slower than real hardware and only compare within a run. Cells: median (min–max) over"
  echo "every sample of the $RUNS run(s), and n, the number of samples; n=1 is a single reading."
  echo
  echo "| figure | time |"
  echo "|---|---|"
  for n in "kubelet registers the Node -> Node Ready" "pod create -> container started (preloaded image)" \
    "TCP connect through the ClusterIP (Service first packet)" "TCP connect to the endpoint directly (peer)" \
    "TCP connect through the ClusterIP, second connection"; do
    echo "| $n | $(ms "$n") |"
  done
  echo "| ClusterIP first packet / endpoint directly (medians) | $(bench_ratio "$(median "TCP connect through the ClusterIP (Service first packet)")" "$(median "TCP connect to the endpoint directly (peer)")") |"
  echo
  echo "Node Ready is the Ready condition's transition time less the Node's creation time (the"
  echo "apiserver's clock for both): it covers the pod network (flannel vxlan, the conflist)"
  echo "coming up after kubelet registers. Pod start is the container's start less the pod's"
  echo "creation (no image pull: the image is preloaded). The connects are the probe pod's"
  echo "(\`probe fetch\`): one TCP handshake each, a new connection every time."
  echo
  echo "### NetworkPolicy enforcement (gpuagent, kube-network-policies)"
  echo
  echo "| figure | time |"
  echo "|---|---|"
  for n in "TCP connect to a policy-selected pod (judged in user space)" "TCP connect to a pod no policy selects (peer)" \
    "NetworkPolicy deleted -> new connections pass" "NetworkPolicy created -> new connections dropped"; do
    echo "| $n | $(ms "$n") |"
  done
  echo "| policy-selected / no policy (medians) | $(bench_ratio "$(median "TCP connect to a policy-selected pod (judged in user space)")" "$(median "TCP connect to a pod no policy selects (peer)")") |"
  echo
  echo "From one pod in a namespace no policy selects, 10 new connections each, alternately, to"
  echo "a pod a tenant's policy selects and lets it in (its first packet goes to gpuagent's"
  echo "queue) and to a pod no policy selects (the peer: never queued). The first connection to"
  echo "the selected pod can take a second: the client's address is not in the apiserver yet,"
  echo "its SYN is dropped and TCP retries (docs/tenants.md). The policy changes are \`probe"
  echo "flip\`'s, 5 per run: a pod deletes and recreates the policy through the apiserver and"
  echo "connects in between, in its one clock, starting a try every 50 ms, each cut off at 900 ms"
  echo "(under the first SYN retransmission). Passing is the start of the first try that passed;"
  echo "dropped is the start of the first try of 2 s of tries that all timed out (a slow allowed"
  echo "try is not a drop; a refusal is an error, not a figure). Each is an upper bound within"
  echo "about 50 ms and the SYN's way to the node."
} >"$section"
if [ -n "$OUT" ]; then
  cat "$section" >"$OUT"
  rm -f "$section"
else
  bench_section node "$section"
fi
cat "${OUT:-docs/bench/node.md}"
