//go:build linux

package qemu

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The central log store (docs/monitoring.md, "Logs"): every node's gpuagent ships its
// journal and its pods' container logs through the control plane's logs-gateway
// (gpuboot's cluster.logsEndpoint, in the JoinBundle) into VictoriaLogs, which
// `controlplane-bootstrap logs` queries on the control-plane host (here: in the rack's
// namespace).

// logEntry is one line of `controlplane-bootstrap logs --output json`: every field.
type logEntry map[string]string

// centralLogs runs `controlplane-bootstrap logs --output json` with args in the rack's
// namespace and returns its entries.
func centralLogs(r *Rack, args ...string) ([]logEntry, string, error) {
	cmd := nsCommand(r.ns, r.bins.controlplane, append([]string{"logs", "--dir", r.cp.dir, "--output", "json"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, string(out), fmt.Errorf("controlplane-bootstrap logs %s: %w", strings.Join(args, " "), err)
	}
	var es []logEntry
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var e logEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, string(out), fmt.Errorf("controlplane-bootstrap logs: line %q: %w", sc.Text(), err)
		}
		es = append(es, e)
	}
	return es, string(out), sc.Err()
}

// waitCentralLogs waits up to a minute (the agent sends every second; the store makes
// lines searchable within a second or so) until the entries args select hold every
// string of want among their messages, and returns them.
func waitCentralLogs(t *testing.T, r *Rack, what string, want []string, args ...string) []logEntry {
	t.Helper()
	var es []logEntry
	var out string
	var err error
	waitFor(t, r.ctx, time.Minute, what+" in the central log store", func() bool {
		es, out, err = centralLogs(r, args...)
		if err != nil {
			return false
		}
		var msgs strings.Builder
		for _, e := range es {
			msgs.WriteString(e["_msg"] + "\n")
		}
		for _, w := range want {
			if !strings.Contains(msgs.String(), w) {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("controlplane-bootstrap logs %s: %v; want messages holding %q; got:\n%s", strings.Join(args, " "), err, want, lastLines(out, 20))
	})
	return es
}

// checkCentralPodLogs checks that a pod's output that kubectl logs read from the node
// is in the central store, by namespace, pod and node, with the node and container
// fields the agent and the gateway set.
func checkCentralPodLogs(t *testing.T, r *Rack, node, ns, pod string, want []string) {
	t.Helper()
	es := waitCentralLogs(t, r, "pod "+ns+"/"+pod+"'s output", want, "--namespace", ns, "--pod", pod, "--since", "30m")
	for _, e := range es {
		if e["node"] != node || e["source"] != "container" || e["container"] == "" {
			t.Errorf("line of pod %s/%s: node %q, source %q, container %q; want node %s, source container and the container's name", ns, pod, e["node"], e["source"], e["container"], node)
			break
		}
	}
	t.Logf("pod %s/%s on %s: %d lines in the central store, as kubectl logs read them", ns, pod, node, len(es))
}

// checkPreviousBoot checks that after node was rebooted (a rollout started at
// rollout), the store lists a boot of it that began before and one that began after,
// and the lines of the one before (gpuagent's, by unit and boot) can be read: they
// were shipped while it ran.
func checkPreviousBoot(t *testing.T, r *Rack, node string, rollout time.Time) {
	var boots []logEntry
	var before, after logEntry
	waitFor(t, r.ctx, time.Minute, "a boot of "+node+" before the rollout and one after in the central log store", func() bool {
		var err error
		boots, _, err = centralLogs(r, "--node", node, "--boots", "--since", "3h")
		before, after = nil, nil
		for _, b := range boots {
			first, err := time.Parse(time.RFC3339Nano, b["first"])
			switch {
			case err != nil:
			case first.Before(rollout):
				before = b
			default:
				after = b
			}
		}
		return err == nil && before != nil && after != nil
	}, func() string {
		return fmt.Sprintf("boots of %s (rollout at %s): %v", node, rollout.UTC().Format(time.RFC3339), boots)
	})
	es, out, err := centralLogs(r, "--node", node, "--boot", before["boot_id"], "--unit", "gpuagent.service", "--since", "3h", "--limit", "0")
	if err != nil || len(es) == 0 {
		t.Fatalf("gpuagent's lines of %s's boot %s (before the reboot): %v\n%s", node, before["boot_id"], err, lastLines(out, 20))
	}
	for _, e := range es {
		if e["boot_id"] != before["boot_id"] || e["unit"] != "gpuagent.service" {
			t.Fatalf("a line of boot %s, unit gpuagent.service has boot %q, unit %q", before["boot_id"], e["boot_id"], e["unit"])
		}
	}
	t.Logf("%s's boots in the central store: %d; the one before the reboot (%s, %s to %s, %s lines): %d gpuagent lines, the last: %s",
		node, len(boots), before["boot_id"], before["first"], before["last"], before["lines"], len(es), es[len(es)-1]["_msg"])
}
