package qemu

import (
	"strings"
	"testing"
)

// checkNodeAPILB: node's kubelet reaches the API through the node's load balancer
// (issue 31; agent/apilb, docs/ha.md). Read from the node's journal in the central log
// store: the agent started gpurack-apilb.service and pointed kubelet at it, and the
// balancer found the API server ready. Every later check on the node, which needs its
// kubelet on the API, goes through it. It logs how many times the balancer found the
// API server unready in this run (a check that took over a second on the loaded guest
// counts), without failing on them: with one API server the connections are kept then.
func checkNodeAPILB(t *testing.T, r *Rack, node string) {
	waitCentralLogs(t, r, node+"'s agent pointing kubelet at the API load balancer",
		[]string{"the API load balancer runs; kubelet reaches the API through it"},
		"--node", node, "--unit", "gpuagent.service", "--query", `"kubelet reaches the API through it"`, "--since", "3h")
	es := waitCentralLogs(t, r, node+"'s API load balancer finding the API server ready",
		[]string{"API load balancer listening", "apiserver upstream healthy"},
		"--node", node, "--unit", "gpurack-apilb.service", "--since", "3h", "--limit", "0")
	unready := 0
	for _, e := range es {
		if strings.Contains(e["_msg"], "apiserver upstream unhealthy") {
			unready++
		}
	}
	t.Logf("%s: kubelet reaches the API through gpurack-apilb.service (127.0.0.1:7445); %d lines from the balancer, the API server found unready %d times", node, len(es), unready)
}
