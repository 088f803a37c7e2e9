package logs

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
)

// linesQueryable posts journal lines of two boots, a container line (gzip) and a line
// two hours old from node gpu-a, and finds each with the logs command by its filters.
func linesQueryable(t *testing.T, c *controlPlane, run string) {
	now := time.Now()
	a := c.client(t, nil, "system:node:gpu-a", "system:nodes")
	body := strings.Join([]string{
		line(now.Add(-10*time.Minute), map[string]string{"_msg": "kubelet started " + run, "source": "journal", "unit": "kubelet.service", "priority": "6", "boot_id": bootA1}),
		line(now.Add(-5*time.Minute), map[string]string{"_msg": "containerd up " + run, "source": "journal", "unit": "containerd.service", "priority": "6", "boot_id": bootA2}),
		line(now.Add(-2*time.Hour), map[string]string{"_msg": "old line " + run, "source": "journal", "unit": "kubelet.service", "priority": "4", "boot_id": bootA1}),
	}, "\n") + "\n"
	if code, msg := c.post(t, a, contractQuery, body, false); code != http.StatusNoContent {
		t.Fatalf("POST journal lines: %d %s", code, msg)
	}
	pod := line(now.Add(-time.Minute), map[string]string{"_msg": "epoch 1 loss 0.5 " + run, "source": "container", "namespace": "vision",
		"pod": "train-0", "container": "main", "stream": "stdout", "boot_id": bootA2, "truncated": "true"})
	if code, msg := c.post(t, a, "", pod+"\n", true); code != http.StatusNoContent {
		t.Fatalf("POST a gzip container line without query arguments: %d %s", code, msg)
	}
	eventually(t, 30*time.Second, "the kubelet line queryable by node and unit", func() error {
		out := c.logs(t, "--node", "gpu-a", "--unit", "kubelet.service", "--since", "1h")
		if !strings.Contains(out, "gpu-a kubelet.service kubelet started "+run) {
			return fmt.Errorf("not in %q", out)
		}
		if strings.Contains(out, "containerd up") || strings.Contains(out, "old line "+run) {
			return fmt.Errorf("another unit's or an older line in %q", out)
		}
		return nil
	})
	eventually(t, 30*time.Second, "the container line queryable by namespace, pod and container", func() error {
		out := c.logs(t, "--namespace", "vision", "--pod", "train-0", "--container", "main", "--since", "1h")
		if !strings.Contains(out, "gpu-a vision/train-0/main epoch 1 loss 0.5 "+run+" [truncated]") || strings.Contains(out, "kubelet started") {
			return fmt.Errorf("by pod: %q; the node's lines: %q", out, c.logs(t, "--node", "gpu-a", "--since", "1h", "--output", "json"))
		}
		return nil
	})
	var out string
	from, until := now.Add(-3*time.Hour).UTC().Format(time.RFC3339), now.Add(-90*time.Minute).UTC().Format(time.RFC3339)
	out = c.logs(t, "--node", "gpu-a", "--from", from, "--until", until)
	if !strings.Contains(out, "old line "+run) || strings.Contains(out, "kubelet started "+run) {
		t.Errorf("--from %s --until %s: %q", from, until, out)
	}
	out = c.logs(t, "--node", "gpu-a", "--boots", "--since", "1d")
	if !strings.Contains(out, bootA1) || !strings.Contains(out, bootA2) || strings.Index(out, bootA1) > strings.Index(out, bootA2) {
		t.Errorf("--boots does not list both boots, older first: %q", out)
	}
	out = c.logs(t, "--node", "gpu-a", "--boot", bootA1, "--since", "1h")
	if !strings.Contains(out, "kubelet started "+run) || strings.Contains(out, "containerd up "+run) {
		t.Errorf("--boot %s: %q", bootA1, out)
	}
	if out, err := c.cli(t, "logs", "--dir", c.dir, "--node", "Bad Node"); err == nil || !strings.Contains(out, `--node "Bad Node" is not a node name`) {
		t.Errorf("a bad --node was not refused by name: %v", err)
	}
}

// nodeNotForged: gpu-a's line that says node gpu-b is stored as gpu-a's.
func nodeNotForged(t *testing.T, c *controlPlane, run string) {
	a := c.client(t, nil, "system:node:gpu-a", "system:nodes")
	msg := "forged " + run
	body := line(time.Now(), map[string]string{"_msg": msg, "node": "gpu-b", "source": "journal", "unit": "evil.service", "boot_id": bootA2})
	if code, text := c.post(t, a, contractQuery, body, false); code != http.StatusNoContent {
		t.Fatalf("POST: %d %s", code, text)
	}
	eventually(t, 30*time.Second, "the forged line stored under the certificate's node", func() error {
		out := c.logs(t, "--unit", "evil.service", "--since", "1h", "--output", "json")
		var e map[string]string
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &e); err != nil {
			return fmt.Errorf("not one JSON line: %q", out)
		}
		if e["node"] != "gpu-a" || e["_msg"] != msg {
			return fmt.Errorf("stored as %v", e)
		}
		return nil
	})
	if out := c.logs(t, "--node", "gpu-b", "--since", "1h"); strings.Contains(out, msg) {
		t.Errorf("the line is found under gpu-b: %q", out)
	}
}

// clientsRefused: no certificate, another CA, a non-node CN, a node CN without
// system:nodes, a query argument off the contract, GET and another path.
func clientsRefused(t *testing.T, c *controlPlane) {
	body := line(time.Now(), map[string]string{"_msg": "refused", "source": "journal", "unit": "x.service"})
	for _, tc := range []struct {
		name   string
		client *http.Client
		query  string
		want   int
	}{
		{"no client certificate", c.client(t, nil, ""), contractQuery, http.StatusForbidden},
		{"monitoring certificate", c.client(t, nil, "gpurack:monitoring"), contractQuery, http.StatusForbidden},
		{"node CN without system:nodes", c.client(t, nil, "system:node:gpu-a", "system:authenticated"), contractQuery, http.StatusForbidden},
		{"extra_fields from the node", c.client(t, nil, "system:node:gpu-a", "system:nodes"), contractQuery + "&extra_fields=node=gpu-b", http.StatusBadRequest},
		{"other stream fields", c.client(t, nil, "system:node:gpu-a", "system:nodes"), "?_stream_fields=_msg", http.StatusBadRequest},
	} {
		if code, msg := c.post(t, tc.client, tc.query, body, false); code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, code, msg, tc.want)
		}
	}
	other, err := pki.NewCA(pki.CARequest{CommonName: "another CA"})
	if err != nil {
		t.Fatal(err)
	}
	// Go's client offers no certificate the server's CA list does not name, so the
	// request arrives without one (403); a client that offers it anyway fails the
	// handshake.
	if resp, err := c.client(t, other, "system:node:gpu-a", "system:nodes").Post(c.gw+"/insert/jsonline", "application/json", strings.NewReader(body)); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("a node certificate of another CA: %d, want 403 or a failed handshake", resp.StatusCode)
		}
	}
	forced := &tls.Config{RootCAs: c.set.CA.CertPool(), GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		kp, err := other.Issue(pki.CertRequest{CommonName: "system:node:gpu-a", Organizations: []string{"system:nodes"}, Usages: []pki.Usage{pki.ClientAuth}})
		if err != nil {
			return nil, err
		}
		cert := kp.TLSCertificate()
		return &cert, nil
	}}
	if _, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: forced}}).Post(c.gw+"/insert/jsonline", "application/json", strings.NewReader(body)); err == nil {
		t.Error("a node certificate of another CA, offered anyway, passed the TLS handshake")
	}
	a := c.client(t, nil, "system:node:gpu-a", "system:nodes")
	for path, want := range map[string]int{"/insert/jsonline": http.StatusMethodNotAllowed, "/select/logsql/query?query=*": http.StatusNotFound, "/metrics": http.StatusForbidden} {
		resp, err := a.Get(c.gw + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s as a node: %d, want %d", path, resp.StatusCode, want)
		}
	}
	resp, err := c.client(t, nil, "gpurack:monitoring").Get(c.gw + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(m), `gpurack_logs_gateway_requests_total{code="403",reason="not_node"}`) {
		t.Errorf("/metrics with the monitoring certificate: %d, refusals not counted:\n%s", resp.StatusCode, m)
	}
}

// oversized: a 17 MiB body (over the 16 MiB default) is 413 and none of its lines is
// stored, while a small one after it is.
func oversized(t *testing.T, c *controlPlane, run string) {
	a := c.client(t, nil, "system:node:gpu-a", "system:nodes")
	big := "big " + run
	one := line(time.Now(), map[string]string{"_msg": big + " " + strings.Repeat("x", 1000), "source": "journal", "unit": "big.service"}) + "\n"
	body := strings.Repeat(one, 17<<20/len(one)+1)
	if code, msg := c.post(t, a, contractQuery, body, false); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a %d-byte body: %d %s, want 413", len(body), code, msg)
	}
	small := "after the big one " + run
	if code, msg := c.post(t, a, contractQuery, line(time.Now(), map[string]string{"_msg": small, "source": "journal", "unit": "big.service"}), false); code != http.StatusNoContent {
		t.Fatalf("POST: %d %s", code, msg)
	}
	eventually(t, 30*time.Second, "the small line after the refused one", func() error {
		out := c.logs(t, "--unit", "big.service", "--since", "1h")
		if !strings.Contains(out, small) {
			return fmt.Errorf("not in %q", tail(out, 3))
		}
		if strings.Contains(out, big+" x") {
			t.Fatalf("a line of the refused body was stored")
		}
		return nil
	})
}

// scraped: Prometheus scrapes VictoriaLogs and, with the monitoring certificate, the
// gateway.
func scraped(t *testing.T, c *controlPlane) {
	eventually(t, time.Minute, "up of victorialogs and logs-gateway", func() error {
		resp, err := http.Get(c.promURL + "/api/v1/query?query=" + url.QueryEscape(`up{job=~"victorialogs|logs-gateway"}`))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var r struct {
			Data struct {
				Result []struct {
					Metric map[string]string
					Value  [2]any
				}
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return err
		}
		up := map[string]any{}
		for _, s := range r.Data.Result {
			up[s.Metric["job"]] = s.Value[1]
		}
		if up["victorialogs"] != "1" || up["logs-gateway"] != "1" {
			return fmt.Errorf("up: %v", up)
		}
		return nil
	})
}
