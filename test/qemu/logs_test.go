//go:build linux

package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// rackLogStore is VictoriaLogs in the rack's namespace (monitoring.logs.port).
const rackLogStore = "127.0.0.1:9429"

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

// storeCount counts the lines of the rack's VictoriaLogs (on the namespace's loopback,
// monitoring.logs.port) that the LogsQL filter selects.
func storeCount(ctx context.Context, client *http.Client, filter string) (int, error) {
	q := url.Values{"query": {filter + " | count() as n"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+rackLogStore+"/select/logsql/query", strings.NewReader(q.Encode()))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var row struct {
		N string `json:"n"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&row); err != nil {
		return 0, fmt.Errorf("count %s: HTTP %d: %w", filter, resp.StatusCode, err)
	}
	return strconv.Atoi(row.N)
}

// journaldScript writes n lines tagged tag into the node's journal through
// systemd-cat, waits until journalctl has them all, and prints how long that took
// (the node's uptime clock in hundredths of a second; no awk in the image):
// "journald N MILLISECONDS".
const journaldScript = `tag=TAG; n=N
t0=$(cut -d' ' -f1 /proc/uptime | tr -d .)
seq -f "logbench line %g" 1 $n | systemd-cat -t $tag
while [ "$(journalctl -q -t $tag -o cat --no-pager | wc -l)" -lt $n ]; do sleep 0.05; done
t1=$(cut -d' ' -f1 /proc/uptime | tr -d .)
echo "journald $n $(( (t1 - t0) * 10 ))"`

// benchLogShipping runs journaldScript on node once (GPURACK_LOGSHIP_RUNS=N: N times,
// for figures with a spread), each run with its own tag,
// while polling the store every 200 ms for that tag's lines: journald's rate (N lines
// over the time journalctl took to show them all, the node's clock) against the
// shipper's (N lines over the time from the first of them in the store to the last,
// the host's clock). The shipper batches every second, so a burst shorter than that
// shows as one batch. Figures only: nothing is asserted of them.
func benchLogShipping(t *testing.T, r *Rack, node *corev1.Node) {
	const n = 9000 // under journald's per-unit burst of 10,000 lines in 30 s
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: nsDial(r.ns)}}
	defer client.CloseIdleConnections()
	runs := 1
	if v := os.Getenv("GPURACK_LOGSHIP_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10 {
			t.Fatalf("GPURACK_LOGSHIP_RUNS=%q: want a count from 1 to 10", v)
		}
		runs = n
	}
	for run := 1; run <= runs; run++ {
		tag := fmt.Sprintf("gpurack-logbench-%d-%d", time.Now().Unix(), run)
		filter := `identifier:="` + tag + `"`
		var first, full time.Time
		done := make(chan struct{})
		go func() {
			defer close(done)
			for deadline := time.Now().Add(4 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				c, err := storeCount(r.ctx, client, filter)
				if err == nil && c > 0 && first.IsZero() {
					first = time.Now()
				}
				if err == nil && c >= n {
					full = time.Now()
					return
				}
			}
		}()
		script := strings.NewReplacer("TAG", tag, "N", strconv.Itoa(n)).Replace(journaldScript)
		p, err := runPodToEnd(r.ctx, r.admin, hostRootPod(node, fmt.Sprintf("logbench-%d", run), script), 3*time.Minute)
		if err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, terminationMessage(p))
		}
		out := podLog(r.ctx, r.admin, p)
		deletePodsIn(t, r.ctx, r.admin, p.Namespace, p.Name)
		<-done
		var lines, ms int
		if _, err := fmt.Sscanf(out, "journald %d %d", &lines, &ms); err != nil || full.IsZero() {
			t.Fatalf("run %d: journald %q (%v); all %d lines in the store: %v", run, out, err, n, !full.IsZero())
		}
		span := full.Sub(first)
		t.Logf("run %d on %s (QEMU TCG guest): journald took %d lines in %d ms (%.0f lines/s); the shipper delivered them to the store over %s (%.0f lines/s, first to last seen, polled every 200 ms, batches every 1 s); ratio shipper/journald %.2f",
			run, node.Name, lines, ms, float64(lines)/(float64(ms)/1000), span.Round(10*time.Millisecond), float64(n)/span.Seconds(),
			(float64(n)/span.Seconds())/(float64(lines)/(float64(ms)/1000)))
	}
}

// checkLongLine: a container's 1 MiB line (containerd writes it as 16 KiB partial
// records) arrives in the store cut at the agent's 64 KiB bound and marked truncated.
func checkLongLine(t *testing.T, r *Rack, node *corev1.Node) {
	p := hostRootPod(node, "one-mib-line", "head -c 1048576 /dev/zero | tr '\\0' x; echo; echo after-the-long-line")
	got, err := runPodBesideRestart(r.ctx, r.admin, p, 3*time.Minute)
	if err != nil {
		t.Fatalf("the 1 MiB line pod: %v\n%s", err, terminationMessage(got))
	}
	defer deletePodsIn(t, r.ctx, r.admin, p.Namespace, p.Name)
	es := waitCentralLogs(t, r, "the pod's lines after its 1 MiB line", []string{"after-the-long-line"}, "--namespace", p.Namespace, "--pod", p.Name, "--since", "30m")
	var long logEntry
	for _, e := range es {
		if strings.HasPrefix(e["_msg"], "xxxx") {
			long = e
		}
	}
	if long == nil || long["truncated"] != "true" || len(long["_msg"]) != 64<<10 || strings.Trim(long["_msg"], "x") != "" {
		t.Fatalf("the 1 MiB line in the store: truncated %q, %d bytes; want truncated, 65536 x's (%d lines)", long["truncated"], len(long["_msg"]), len(es))
	}
	t.Logf("a 1 MiB container line: stored cut to %d bytes, truncated=%s, and the next line after it", len(long["_msg"]), long["truncated"])
}
