# shellcheck shell=bash
# Step 8 of hack/rack-demo.sh under DEMO_WORKLOADS=1 (make demo-workloads), sourced by it
# once the rack is commissioned: two tenants' users queue GPU Jobs through Kueue on the
# simulated rack. Uses rack-demo.sh's $work, step, die and the admin KUBECONFIG.
#
# The nodes are the GPU simulator without kubelet: Kueue admits and places each Job's
# pod, the scheduler binds it, and no pod runs. Reclaiming borrowed GPUs needs pods that
# stop, so it is shown on QEMU nodes (TestRack), not here.

step "8. Two tenants queue GPU Jobs through Kueue (simulated nodes: pods are bound, none runs)"
cat >"$work/tenants.yaml" <<'EOF'
apiVersion: gpurack.io/v1alpha1
kind: TenantList
tenants:
  - name: alpha
    quota: {gpus: 8}
  - name: beta
    quota: {gpus: 8}
EOF
controlplane-bootstrap tenants apply --dir "$work/cp" "$work/tenants.yaml" --prune >"$work/tenants-apply.log" 2>&1 \
  || { cat "$work/tenants-apply.log"; die "tenants apply failed"; }
echo "tenants alpha and beta, 8 GPUs each, in one cohort (each may borrow the other's idle GPUs)"
for u in dana:alpha carol:beta; do
  controlplane-bootstrap users add --dir "$work/cp" "${u%%:*}" --tenant "${u#*:}" --role user --out "$work/${u%%:*}.kubeconfig" >/dev/null \
    || die "users add ${u%%:*} failed"
done
echo "users dana (alpha) and carol (beta), each with only their own kubeconfig from users add"
dana() { kubectl --kubeconfig "$work/dana.kubeconfig" "$@"; }
carol() { kubectl --kubeconfig "$work/carol.kubeconfig" "$@"; }

# job NS NAME GPUS: a Job of one pod asking for GPUS GPUs, in NS's queue.
job() {
  cat <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: $2
  namespace: $1
  labels: {kueue.x-k8s.io/queue-name: default}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: train
          image: $(cat "$k8s/images/pause.tag")
          resources: {limits: {nvidia.com/gpu: $3}}
EOF
}
# workload_state NS JOB: the Workload's Admitted status, or QuotaReserved's message.
workload_state() {
  kubectl get workloads -n "$1" -o jsonpath="{range .items[?(@.metadata.ownerReferences[0].name==\"$2\")]}{.status.conditions[?(@.type==\"Admitted\")].status}|{.status.conditions[?(@.type==\"QuotaReserved\")].message}{end}" 2>/dev/null
}
# await_admitted NS JOB: until its Workload is admitted and its pod bound to a node.
await_admitted() {
  local st="" node=""
  for _ in $(seq 1 120); do
    st=$(workload_state "$1" "$2")
    node=$(kubectl get pods -n "$1" -l "job-name=$2" -o jsonpath='{.items[0].spec.nodeName}' 2>/dev/null || true)
    [ "${st%%|*}" = True ] && [ -n "$node" ] && break
    sleep 0.5
  done
  [ "${st%%|*}" = True ] && [ -n "$node" ] || die "Job $1/$2 not admitted and bound in 60 s: ${st#*|} (Kueue log: $work/cp/logs/kueue.log)"
  echo "$1/$2 ($3 GPUs): admitted, its pod placed by Kueue and bound to $node"
}
# await_waiting NS JOB WORD: until its Workload waits with a reason containing WORD.
await_waiting() {
  local st=""
  for _ in $(seq 1 120); do
    st=$(workload_state "$1" "$2")
    [ -n "$st" ] && [ "${st%%|*}" != True ] && grep -q "$3" <<<"$st" && break
    sleep 0.5
  done
  grep -q "$3" <<<"$st" || die "Job $1/$2 does not wait with a reason about $3: $st"
  echo "$1/$2 waits in alpha's queue, suspended, not refused. Kueue's reason: ${st#*|}"
}

job alpha train-1 4 | dana apply -f - >/dev/null
await_admitted alpha train-1 4
job alpha big 9 | dana apply -f - >/dev/null
await_waiting alpha big "topology"
job alpha train-2 4 | dana apply -f - >/dev/null
await_admitted alpha train-2 4
job alpha train-3 4 | dana apply -f - >/dev/null
await_admitted alpha train-3 4
job beta train-b 2 | carol apply -f - >/dev/null
await_admitted beta train-b 2
echo
echo "dana: kubectl get workloads -n alpha"
dana get workloads -n alpha
echo
echo "controlplane-bootstrap tenants status (alpha uses 12 GPUs: its 8 and 4 of beta's idle ones, borrowed)"
controlplane-bootstrap tenants status --dir "$work/cp"
