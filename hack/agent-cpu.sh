#!/usr/bin/env bash
# agent-cpu.sh measures what `gpuagent run` costs on the simulated 8-GPU node: CPU
# (utime+stime from /proc/PID/stat over a window, after a warm-up) and resident memory
# with a per-mapping breakdown from /proc/PID/smaps. It prints one table.
#
#   hack/agent-cpu.sh [-b GPUAGENT] [-s SECONDS] [-w WARMUP] [-k] [-n] [-i SECONDS]
#                     [-m SECONDS] [-- EXTRA RUN FLAGS]
#
# -k turns the device plugin on (--device-plugin) against hack/kubelet-stub, the
# kubelet side of the device-plugin API: it registers the plugin, keeps ListAndWatch
# open and asks GetPreferredAllocation and Allocate for 2 GPUs every second, as kubelet
# admitting a pod would (a stand-in for kubelet, docs/testing.md).
#
# -n makes the agent node-like, as far as a host without a cluster allows: the gRPC
# listener on loopback (plaintext, --insecure), the kmsg watch on /dev/kmsg, and gossip
# with a second agent (its rack peer, also started here) under a rack key. What only a
# joined node runs (enrollment and heartbeats, the pod network, kube-proxy,
# NetworkPolicy, the device plugin serving a real kubelet) is not on: TestRack reads
# the same figures from the agent of its simulated GPU node, where all of it is.
# -i samples VmRSS every SECONDS through the window and prints the median and maximum;
# -m scrapes /metrics every SECONDS through the window, as Prometheus would.
#
# Defaults: builds ./agent/cmd/gpuagent, 60 s window, 5 s warm-up, and the agent's
# default settings (--interval 10s) with the sim:dgxh100 backend, no gRPC TCP listener,
# /metrics on a loopback port nobody scrapes, gossip off. Add e.g. `-- --interval 1s`
# to poll faster. The figures depend on the host; on a shared machine, CPU time (not
# wall time) is what is counted, so other load changes them little.
set -euo pipefail

bin="" secs=60 warm=5 stub="" nodelike="" every="" scrape=""
usage="usage: $0 [-b GPUAGENT] [-s SECONDS] [-w WARMUP] [-k] [-n] [-i SECONDS] [-m SECONDS] [-- EXTRA RUN FLAGS]"
while getopts "b:s:w:kni:m:" o; do
  case $o in
    b) bin=$OPTARG ;;
    s) secs=$OPTARG ;;
    w) warm=$OPTARG ;;
    k) stub=1 ;;
    n) nodelike=1 ;;
    i) every=$OPTARG ;;
    m) scrape=$OPTARG ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
for v in "$secs" "$warm" ${every:+"$every"} ${scrape:+"$scrape"}; do
  [[ $v =~ ^[0-9]+$ && $v -gt 0 ]] || { echo "agent-cpu.sh: $v is not a whole number of seconds above 0; $usage" >&2; exit 2; }
done
shift $((OPTIND - 1))

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pid="" spid="" ppid_="" mpid=""
trap 'kill $pid $spid $ppid_ $mpid 2>/dev/null || true; wait $pid $spid $ppid_ $mpid 2>/dev/null || true; rm -rf "$work"' EXIT
if [[ -z $bin ]]; then
  (cd "$root" && go build -o "$work/gpuagent" ./agent/cmd/gpuagent)
  bin=$work/gpuagent
fi
plugin=()
if [[ -n $stub ]]; then
  (cd "$root" && go build -o "$work/kubelet-stub" ./hack/kubelet-stub)
  "$work/kubelet-stub" --dir "$work/kubelet/device-plugins" >"$work/stub.log" 2>&1 &
  spid=$!
  plugin=(--device-plugin)
fi

# Four loopback TCP ports nobody listens on now, distinct (all held open while chosen):
# /metrics, gRPC, and the two gossip members'.
read -r mport gport g1 g2 < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
node=()
if [[ -n $nodelike ]]; then
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/rack.key"
  gossip=(--rack r1 --gossip-key-file "$work/rack.key")
  node=(--listen "127.0.0.1:$gport" --insecure --kmsg /dev/kmsg --node-name sim-a
    --gossip-bind "127.0.0.1:$g1" --gossip-seed "127.0.0.1:$g2" "${gossip[@]}")
  mkdir -p "$work/peer"
  "$bin" run --gpu-backend sim:dgxh100 --profile "$root/profiles/debian12-nvidia535.yaml" \
    --listen "" --metrics-listen "" --socket "$work/peer/agent.sock" --key-dir "$work/peer" \
    --kubelet-dir "$work/peer/kubelet" --kmsg off --log-level warn --node-name sim-b \
    --gossip-bind "127.0.0.1:$g2" --gossip-seed "127.0.0.1:$g1" "${gossip[@]}" >"$work/peer.log" 2>&1 &
  ppid_=$!
fi
"$bin" run --gpu-backend sim:dgxh100 --profile "$root/profiles/debian12-nvidia535.yaml" \
  --listen "" --metrics-listen "127.0.0.1:$mport" --socket "$work/agent.sock" --key-dir "$work" \
  --kubelet-dir "$work/kubelet" --kmsg off --log-level info "${node[@]}" "${plugin[@]}" "$@" >"$work/log" 2>&1 &
pid=$!

# ticks prints utime+stime of $pid in clock ticks (10 ms: coarse for an idle agent).
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat"; }
# cpuns prints the CPU time of $pid's threads in nanoseconds (schedstat: fine-grained;
# Go keeps its threads, so none of the time leaves with an exited thread).
cpuns() { cat /proc/"$pid"/task/*/schedstat | awk '{ s += $1 } END { printf "%d\n", s }'; }

sleep "$warm"
kill -0 "$pid" 2>/dev/null || { echo "gpuagent exited during warm-up:" >&2; cat "$work/log" >&2; exit 1; }
if [[ -n $scrape ]]; then
  (while curl -fsS -o /dev/null "http://127.0.0.1:$mport/metrics"; do sleep "$scrape"; done; echo "agent-cpu.sh: /metrics stopped answering" >&2) &
  mpid=$!
fi
t0=$(ticks) n0=$(cpuns) w0=$(date +%s.%N)
if [[ -n $every ]]; then
  end=$(($(date +%s) + secs))
  while [[ $(date +%s) -lt $end ]]; do
    awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" >>"$work/rss" || { echo "gpuagent exited:" >&2; cat "$work/log" >&2; exit 1; }
    sleep "$every"
  done
else
  sleep "$secs"
fi
t1=$(ticks) n1=$(cpuns) w1=$(date +%s.%N)
kill -0 "$pid" 2>/dev/null || { echo "gpuagent exited during the window:" >&2; cat "$work/log" >&2; exit 1; }
hz=$(getconf CLK_TCK)
exe=$(readlink "/proc/$pid/exe")

echo "gpuagent run --gpu-backend sim:dgxh100 ${plugin[*]} $* ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
if [[ -n $stub ]]; then
  grep -q 'registered' "$work/stub.log" && grep -q 'allocating' "$work/stub.log" || { echo "the device plugin did not register and allocate:" >&2; cat "$work/stub.log" "$work/log" >&2; exit 1; }
  echo "device plugin: $(grep -m1 registered "$work/stub.log" | sed 's/^kubelet-stub: //'); $(grep -c '' "$work/stub.log") stub lines; $(grep -m1 'devices,' "$work/stub.log" | sed 's/^kubelet-stub: //')"
fi
awk -v t="$((t1 - t0))" -v ns="$((n1 - n0))" -v hz="$hz" -v w0="$w0" -v w1="$w1" 'BEGIN {
  s = w1 - w0
  printf "%-34s %10.1f s\n", "window", s
  printf "%-34s %10.2f s  %7.3f %% of one core\n", "CPU, utime+stime (/proc/PID/stat)", t / hz, 100 * t / hz / s
  printf "%-34s %10.3f s  %7.3f %% of one core\n", "CPU, threads\x27 schedstat", ns / 1e9, 100 * ns / 1e9 / s
}'
if [[ -n $nodelike ]]; then
  members=$(grep -c 'rack member changed' "$work/log" || true)
  [[ $members -gt 0 ]] || { echo "node-like: the agent never saw its gossip peer:" >&2; cat "$work/log" "$work/peer.log" >&2; exit 1; }
  echo "node-like: gRPC on loopback, kmsg watch on /dev/kmsg, gossip with a peer agent ($members membership changes seen)${scrape:+, /metrics scraped every $scrape s}"
fi
if [[ -n $every ]]; then
  sort -n "$work/rss" | awk -v every="$every" '{ v[NR] = $1 } END {
    printf "%-34s %10.1f MiB  %d samples every %d s; max %.1f MiB, min %.1f MiB\n", "VmRSS median", v[int((NR + 1) / 2)] / 1024, NR, every, v[NR] / 1024, v[1] / 1024 }'
fi
grep -E '^(VmHWM|VmRSS|RssAnon|RssFile):' "/proc/$pid/status" | awk '{ printf "%-34s %10.1f MiB\n", $1, $2 / 1024 }'

# smaps: RSS by mapping, grouped into the binary's text, data and read-only segments,
# heap, stack, anonymous mappings, and other files (shared libraries).
echo "RSS by mapping (smaps):"
awk -v exe="$exe" '
  /^[0-9a-f]+-[0-9a-f]+ / {
    perms = $2; path = (NF >= 6) ? $6 : ""
    if (path == exe) name = "binary " (perms ~ /x/ ? "text" : perms ~ /w/ ? "data" : "rodata")
    else if (path == "") name = "anonymous (Go heap, stacks)"
    else if (path ~ /^\[/) name = path
    else { n = split(path, p, "/"); name = p[n] }
    next
  }
  /^Rss:/ { rss[name] += $2 }
  END { for (k in rss) if (rss[k] > 0) printf "%d\t%s\n", rss[k], k }
' "/proc/$pid/smaps" | sort -rn | awk -F'\t' '{ printf "  %-32s %10.1f MiB\n", $2, $1 / 1024 }'
