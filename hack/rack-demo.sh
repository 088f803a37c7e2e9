#!/usr/bin/env bash
# rack-demo.sh: a rack of NODES (default 20) simulated 8-GPU servers powered on against
# the real control plane and the real gpuboot, on this one machine. Run by `make
# demo-rack` after deps and build; `make demo-clean` removes what it made.
#
# Every node is a real gpuagent process with the GPU simulator (labelled simulated on
# its Node and in its reports; the demo's gpuboot.yaml sets enrollment.allowSimulated,
# without which gpuboot quarantines simulated machines): it registers with gpuboot under its own identity
# (serial, MAC, UUID from a generated vendor rack manifest), is approved by the
# allowlist built from that manifest, receives its JoinBundle, joins Kubernetes by TLS
# bootstrap, runs its commissioning checklist and gossips with the rack. Slot 7 has an
# XID 79 on GPU 3 from power-on and is quarantined; once the rack is ready, slot 12 gets
# an uncorrectable ECC error on GPU 5, which withdraws that GPU alone (the Node keeps 7
# allocatable and no taint). At the end: the rack commissioning checklist (totals: 19
# ready, 1 quarantined, 151 GPUs allocatable), kubectl get nodes, and a pod asking for
# 8 GPUs bound to a healthy node.
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=${NODES:-20}
QUARANTINE_SLOT=${QUARANTINE_SLOT:-7}
ECC_SLOT=${ECC_SLOT:-12}
k8s=${GPURACK_K8S_DIR:-${GPURACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpurack}/k8s/v1.34.2}
# GPURACK_BIN: where the four binaries are (default: make build's bin/).
export PATH="${GPURACK_BIN:-$PWD/bin}:$k8s/bin:$PATH"
work=${DEMO_DIR:-${TMPDIR:-/tmp}/gpurack-rack-demo}
profile=profiles/debian12-nvidia535.yaml

# Ports: the control plane's (shifted off the defaults, as hack/demo.sh does), gpuboot's,
# and per node an agent API port and a gossip port.
# DEMO_PORT_SHIFT moves them all (tests run the demo beside other servers).
o=${DEMO_PORT_SHIFT:-0}
api_port=$((26443 + o)) etcd_port=$((22379 + o)) etcd_peer=$((22380 + o)) etcd_metrics=$((22381 + o))
cm_port=$((30257 + o)) sched_port=$((30259 + o)) boot_http=$((28080 + o)) boot_tls=$((28443 + o))
agent_base=$((29100 + o)) gossip_base=$((29300 + o))
# DEMO_WORKLOADS=1 (make demo-workloads): Kueue runs with the control plane, and step 8
# queues tenants' Jobs on the rack.
workloads=${DEMO_WORKLOADS:-0}
kueue_web=$((9443 + o)) kueue_health=$((9444 + o)) kueue_metrics=$((9445 + o))

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { echo "rack-demo: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

for tool in controlplane-bootstrap gpuboot gpuagent gpuimage kubectl grpcurl; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH: run make build (and make k8s-bins for kubectl and grpcurl)"
done

stop_all() {
  if [ -d "$work/pids" ]; then
    for f in "$work"/pids/*; do [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  fi
  controlplane-bootstrap stop --dir "$work/cp" >/dev/null 2>&1 || true
  wait 2>/dev/null || true
  # clean runs in another shell than the one that started them, so wait cannot: poll
  # until they are gone (an agent leaves the gossip first), then kill what is left,
  # so that the ports are free when this returns.
  if [ -d "$work/pids" ]; then
    for f in "$work"/pids/*; do
      [ -e "$f" ] || continue
      pid=$(cat "$f")
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
  fi
}
if [ "${1:-}" = clean ]; then
  stop_all
  rm -rf "$work"
  echo "rack-demo: removed $work"
  exit 0
fi

# Refuse to start on a machine where a port is taken, naming the port and who needs it.
taken() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
check_port() { if taken "$1"; then die "port $1 ($2) is taken: stop what listens there (ss -ltnp 'sport = :$1'), or run make demo-clean if an earlier demo is still up"; fi; }
check_port $api_port "kube-apiserver"; check_port $etcd_port "etcd client"; check_port $etcd_peer "etcd peer"
check_port $etcd_metrics "etcd metrics"; check_port $cm_port "kube-controller-manager"; check_port $sched_port "kube-scheduler"
check_port $boot_http "gpuboot HTTP"; check_port $boot_tls "gpuboot TLS (enrollment, operators)"
if [ "$workloads" = 1 ]; then
  check_port $kueue_web "Kueue webhooks"; check_port $kueue_health "Kueue health"; check_port $kueue_metrics "Kueue metrics"
fi
for i in $(seq 1 "$NODES"); do check_port $((agent_base + i)) "gpuagent API of slot $i"; check_port $((gossip_base + i)) "gpuagent gossip of slot $i"; done

rm -rf "$work"
mkdir -p "$work/pids"
trap 'echo; echo "rack-demo: interrupted, stopping everything"; stop_all; exit 130' INT TERM
trap 'rc=$?; if [ $rc != 0 ]; then echo "rack-demo: failed (exit $rc); logs are in $work; make demo-clean stops and removes it"; stop_all; fi' EXIT
start=$(now)

step "1. Control plane (kube-apiserver, etcd, controller-manager, scheduler from the pinned binaries)"
sed -e "s/port: 6443/port: $api_port/; s/:6443/:$api_port/; s/clientPort: 2379/clientPort: $etcd_port/; s/peerPort: 2380/peerPort: $etcd_peer/" \
    -e "s/metricsPort: 2381/metricsPort: $etcd_metrics/; s/port: 10257/port: $cm_port/; s/port: 10259/port: $sched_port/" \
    docs/examples/cluster.yaml >"$work/cluster.yaml"
if [ "$workloads" = 1 ]; then
  sed -i -e "/^queues:/,/^\$/ { s/enabled: false/enabled: true/; s/webhookPort: 9443/webhookPort: $kueue_web/; s/healthPort: 9444/healthPort: $kueue_health/; s/metricsPort: 9445/metricsPort: $kueue_metrics/; }" "$work/cluster.yaml"
  grep -q '^  enabled: true' <(sed -n '/^queues:/,/^$/p' "$work/cluster.yaml") || die "could not turn queues on in $work/cluster.yaml"
  echo "queues.enabled: true (make demo-workloads): Kueue starts with the control plane"
fi
controlplane-bootstrap init --config "$work/cluster.yaml" --dir "$work/cp" --foreground >"$work/cp.log" 2>&1 &
echo $! >"$work/pids/controlplane"
for _ in $(seq 1 180); do grep -q '^ready in' "$work/cp.log" && break; kill -0 "$(cat "$work/pids/controlplane")" 2>/dev/null || { cat "$work/cp.log"; die "the control plane did not start"; }; sleep 1; done
grep -q '^ready in' "$work/cp.log" || die "the control plane was not ready in 180 s (log: $work/cp.log)"
grep '^ready in' "$work/cp.log"
controlplane-bootstrap join-config --dir "$work/cp" --out "$work/join" >/dev/null
export KUBECONFIG="$work/cp/admin.conf"
[ -f "$KUBECONFIG" ] || die "no admin kubeconfig at $KUBECONFIG"

step "2. The vendor's rack manifest ($NODES servers) and gpuboot with an allowlist built from it"
manifest="$work/rack-r1.csv"
echo "serial,mac,rack,slot" >"$manifest"
for i in $(seq 1 "$NODES"); do printf 'SN-R1-%02d,02:00:00:00:01:%02x,r1,%02d\n' "$i" "$i" "$i" >>"$manifest"; done
head -3 "$manifest"; echo "… ($NODES rows)"
init_out=$(gpuboot init --state-dir "$work/gpuboot/state" --advertise 127.0.0.1 --rack r1)
pin=$(sed -n 's/^CA pin (gpurack.enroll.ca): //p' <<<"$init_out")
[ -n "$pin" ] || die "gpuboot init printed no CA pin: $init_out"
gpuimage keygen "$work/gpuboot/images.key" "$work/gpuboot/images.pub" >/dev/null
mkdir -p "$work/gpuboot/images"
cp "$manifest" "$work/gpuboot/rack-r1.csv"
cat >"$work/gpuboot/gpuboot.yaml" <<EOF
stateDir: state
advertise: 127.0.0.1
listen: {http: "127.0.0.1:$boot_http", tls: "127.0.0.1:$boot_tls"}
images: {store: images, trustedKeys: [images.pub]}
racks: [{name: r1, defaultImage: 0123456789abcdef0123456789abcdef01234567}]
dhcp: {enabled: false}
tftp: {enabled: false}
policy: {approval: allowlist, allowlist: rack-r1.csv}
# Every simulated machine calls from 127.0.0.1, one source to gpuboot's per-source limit
# on Register and Heartbeat (5 a second, burst 50, per machine address in a real rack):
# the one address gets the whole rack's share.
enrollment: {allowSimulated: true, sourceRate: $((NODES * 5)), sourceBurst: $((NODES * 50))}
cluster: {kubeconfig: $work/join/enroller.kubeconfig}
logLevel: info
EOF
echo "policy: approval allowlist (rack-r1.csv); the nodes are the GPU simulator, labelled gpurack.io/simulated; enrollment.allowSimulated: true lets them be ready (gpuboot warns at start)"
echo "all $NODES machines call from 127.0.0.1, so that one address gets the rack's share of the per-source limit (enrollment.sourceRate $((NODES * 5))/s, sourceBurst $((NODES * 50)))"
gpuboot serve --config "$work/gpuboot/gpuboot.yaml" >"$work/gpuboot.log" 2>&1 &
echo $! >"$work/pids/gpuboot"
for _ in $(seq 1 60); do taken $boot_tls && break; sleep 0.5; done
taken $boot_tls || die "gpuboot did not listen on $boot_tls (log: $work/gpuboot.log)"
ops=(--server "127.0.0.1:$boot_tls" --credentials "$work/gpuboot/state/operators/admin")

step "3. Power on $NODES servers × 8 simulated GPUs (slot $QUARANTINE_SLOT has an XID 79 on GPU 3)"
poweron=$(now)
# gpuboot's CPU time (utime + stime, clock ticks) before the storm, for the figure after it.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
boot_pid=$(cat "$work/pids/gpuboot")
boot_cpu0=$(cpu_ticks "$boot_pid")
for i in $(seq 1 "$NODES"); do
  n="$work/nodes/$(printf 'slot%02d' "$i")"
  mkdir -p "$n/root/sys/class/dmi/id" "$n/root/proc" "$n/run"
  printf 'SN-R1-%02d\n' "$i" >"$n/root/sys/class/dmi/id/product_serial"
  printf '4C4C4544-0000-1000-8000-%012X\n' "$i" >"$n/root/sys/class/dmi/id/product_uuid"
  printf 'console=ttyS0 BOOTIF=01-02-00-00-00-01-%02x quiet\n' "$i" >"$n/root/proc/cmdline"
  fault=()
  [ "$i" = "$QUARANTINE_SLOT" ] && fault=(--fault xid:79@gpu3)
  gpuagent run --gpu-backend sim:dgxh100 --profile "$profile" --sim-seed "$(printf 'r1-slot%02d' "$i")" \
    --enroll "127.0.0.1:$boot_tls" --enroll-ca "$pin" --key-dir "$n/run" --facts-root "$n/root" \
    --listen "127.0.0.1:$((agent_base + i))" --metrics-listen "" --socket "$n/agent.sock" \
    --gossip-bind "127.0.0.1:$((gossip_base + i))" --gossip-seed "127.0.0.1:$((gossip_base + 1))" --gossip-local --kubelet-dir "$n/kubelet" \
    --interval 10s --clear-after 10s "${fault[@]}" >"$n/agent.log" 2>&1 &
  echo $! >"$work/pids/agent$i"
done
echo "$NODES gpuagent processes started; progress (one line per state change):"

# Follow the machines in gpuboot until every one is ready or quarantined.
declare -A seen
deadline=$(( $(date +%s) + ${DEMO_TIMEOUT:-600} ))
while :; do
  # An empty list (gpuboot slow to answer under load) or a line with no state is
  # skipped, not an error: under set -e a grep finding nothing would end the demo.
  list=$(gpuboot machines list "${ops[@]}" 2>/dev/null || true)
  done_count=0
  while read -r line; do
    key=$(awk '{print $1}' <<<"$line"); state=$(grep -oE '\b(discovered|registered|approved|joining|commissioning|ready|quarantined|rejected|retired)\b' <<<"$line" | head -1 || true)
    [ -n "$state" ] || continue
    if [ "${seen[$key]:-}" != "$state" ]; then
      seen[$key]=$state
      printf '  %7s  %s\n' "$(since "$start")" "$line"
    fi
    case $state in ready|quarantined) done_count=$((done_count + 1)) ;; esac
  done <<<"$(tail -n +2 <<<"$list")"
  [ "$done_count" -ge "$NODES" ] && break
  [ "$(date +%s)" -lt "$deadline" ] || die "after ${DEMO_TIMEOUT:-600} s only $done_count of $NODES machines are ready or quarantined (logs: $work)"
  sleep 1
done
echo "all $NODES machines commissioned in $(since "$poweron") from power-on ($(since "$start") from the start of the demo)"
boot_cpu=$(( $(cpu_ticks "$boot_pid") - boot_cpu0 ))
boot_hwm=$(awk '/^VmHWM:/ { printf "%.0f", $2 / 1024 }' "/proc/$boot_pid/status" 2>/dev/null || echo '?')
echo "gpuboot during the enrollment storm: $(awk -v t="$boot_cpu" 'BEGIN { printf "%.1f", t / 100 }') s of CPU, peak RSS ${boot_hwm} MiB"

step "4. After the rack is ready: an uncorrectable ECC error on slot $ECC_SLOT, GPU 5 (withdrawn alone, the node keeps 7)"
ecc_node="$work/nodes/$(printf 'slot%02d' "$ECC_SLOT")"
ecc_name=$(printf 'gpu-r1-%02d' "$ECC_SLOT")
t_ecc=$(now)
grpcurl -plaintext -unix -d '{"fault": {"spec": "ecc-uncorrected:1@gpu5"}}' "$ecc_node/agent.sock" gpurack.agent.v1.AgentService/InjectFault >/dev/null \
  || die "InjectFault on slot $ECC_SLOT failed (log: $ecc_node/agent.log)"
alloc=""
for _ in $(seq 1 100); do
  alloc=$(kubectl get node "$ecc_name" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' 2>/dev/null || true)
  [ "$alloc" = 7 ] && break
  sleep 0.2
done
[ "$alloc" = 7 ] || die "node $ecc_name still has $alloc allocatable nvidia.com/gpu 20 s after the ECC error (log: $ecc_node/agent.log)"
echo "$ecc_name: allocatable nvidia.com/gpu 8 -> 7 after $(since "$t_ecc"); GPUHealthy $(kubectl get node "$ecc_name" -o jsonpath='{.status.conditions[?(@.type=="GPUHealthy")].status}/{.status.conditions[?(@.type=="GPUHealthy")].reason}'), so no gpurack.io/gpu-unhealthy taint"
# gpuboot hears the health change in the agent's next heartbeat.
for _ in $(seq 1 50); do
  gpuboot rack report r1 --format json "${ops[@]}" 2>/dev/null | grep -q '"allocatableGpuCount": 7' && break
  sleep 0.2
done

step "5. The rack commissioning checklist"
gpuboot rack report r1 "${ops[@]}"
gpuboot rack report r1 --format json "${ops[@]}" >"$work/rack-r1.json"
if gpuboot rack report r1 --format html "${ops[@]}" >"$work/rack-r1.html" 2>/dev/null; then
  echo "HTML: $work/rack-r1.html"
else
  rm -f "$work/rack-r1.html"
fi
echo "JSON: $work/rack-r1.json"

step "6. kubectl get nodes"
kubectl get nodes -o custom-columns='NAME:.metadata.name,GPUS:.status.allocatable.nvidia\.com/gpu,TAINTS:.spec.taints[*].key,SIMULATED:.metadata.labels.gpurack\.io/simulated'

step "7. A pod asking for 8 GPUs is scheduled onto a healthy node"
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: train-8gpu, namespace: default}
spec:
  containers:
    - name: train
      image: $(cat "$k8s/images/pause.tag")
      resources: {limits: {nvidia.com/gpu: 8}}
EOF
for _ in $(seq 1 60); do node=$(kubectl get pod train-8gpu -o jsonpath='{.spec.nodeName}'); [ -n "$node" ] && break; sleep 1; done
[ -n "${node:-}" ] || { kubectl describe pod train-8gpu | tail -5; die "the 8-GPU pod was not scheduled"; }
echo "train-8gpu bound to $node (simulated nodes run no kubelet, so the pod stays Pending there: binding is what this shows)"

if [ "$workloads" = 1 ]; then
  . hack/workloads-demo.sh
else
  echo
  echo "make demo-workloads runs this demo with Kueue and then queues two tenants' GPU Jobs on the rack."
fi

step "Done in $(since "$start")"
trap - EXIT
echo "Everything is still running: kubectl (KUBECONFIG=$KUBECONFIG), gpuboot machines … ${ops[*]}."
echo "make demo-clean stops it and removes $work."
