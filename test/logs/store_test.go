package logs

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/pki"
)

// contractQuery is what the agent sends (docs/contracts.md §15).
const contractQuery = "?_stream_fields=node,source,unit,namespace,pod,container&_time_field=_time&_msg_field=_msg"

const (
	bootA1 = "0123456789abcdef0123456789abcdef"
	bootA2 = "fedcba9876543210fedcba9876543210"
)

// TestLogStore runs init with the log store and checks it end to end: both components
// healthy with the retention flags rendered; lines a node posts are found by node,
// unit, pod, boot and time range with the logs command; a node field in the body is
// replaced by the certificate's node; a client without a node certificate of the
// cluster CA is refused; an oversized body is 413 and stores nothing; Prometheus
// scrapes VictoriaLogs and the gateway.
func TestLogStore(t *testing.T) {
	testcluster.Require(t, "prometheus", "alertmanager", "kube-state-metrics", "victoria-logs")
	c := startControlPlane(t)
	set, err := clusterpki.Load(filepath.Join(c.dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	c.gw = fmt.Sprintf("https://127.0.0.1:%d", c.cfg.Monitoring.Logs.Gateway.Port)
	c.set = set
	run := fmt.Sprintf("r%d", time.Now().UnixNano())

	t.Run("components", func(t *testing.T) { componentsUp(t, c) })
	t.Run("lines by node, unit, pod, boot and time", func(t *testing.T) { linesQueryable(t, c, run) })
	t.Run("node field cannot be forged", func(t *testing.T) { nodeNotForged(t, c, run) })
	t.Run("clients refused", func(t *testing.T) { clientsRefused(t, c) })
	t.Run("oversized body stores nothing", func(t *testing.T) { oversized(t, c, run) })
	t.Run("scraped", func(t *testing.T) { scraped(t, c) })
	t.Run("certs renew logs-gateway", func(t *testing.T) { renewed(t, c) })
}

// renewed: `certs renew logs-gateway` asks the supervisor to restart the gateway, which
// then serves the new certificate, and nodes still ship through it.
func renewed(t *testing.T, c *controlPlane) {
	serial := func() string {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(c.gw, "https://"), &tls.Config{RootCAs: c.set.CA.CertPool()})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serial()
	out, err := c.cli(t, "certs", "renew", "logs-gateway", "--dir", c.dir)
	if err != nil || !strings.Contains(out, "logs-gateway restarted") {
		t.Fatalf("certs renew logs-gateway: %v", err)
	}
	if after := serial(); after == before {
		t.Errorf("the gateway still serves serial %s after the renewal", before)
	}
	a := c.client(t, nil, "system:node:gpu-a", "system:nodes")
	if code, msg := c.post(t, a, contractQuery, line(time.Now(), map[string]string{"_msg": "after renewal", "source": "journal", "unit": "x.service"}), false); code != http.StatusNoContent {
		t.Errorf("POST after the renewal: %d %s", code, msg)
	}
}

// componentsUp: status lists both healthy, and victoria-logs runs with the
// configured retention and its data under DIR/monitoring/logs.
func componentsUp(t *testing.T, c *controlPlane) {
	out, err := c.cli(t, "status", "--dir", c.dir)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	for _, name := range []string{"victoria-logs", "logs-gateway"} {
		if !strings.Contains(out, name+" ") || strings.Contains(out, name+" NOT") {
			t.Errorf("status does not show %s healthy", name)
		}
	}
	pid, err := os.ReadFile(filepath.Join(c.dir, "run", "victoria-logs.pid"))
	if err != nil {
		t.Fatal(err)
	}
	cmdline, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(string(cmdline), "\x00")
	for _, want := range []string{"--retentionPeriod=7d", "--retention.maxDiskSpaceUsageBytes=1GiB", "--storageDataPath=" + filepath.Join(c.dir, "monitoring", "logs")} {
		if !contains(args, want) {
			t.Errorf("victoria-logs runs without %s: %q", want, args)
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// client is an HTTPS client trusting the cluster CA and presenting a certificate of ca
// (nil: the cluster CA) for cn in groups; cn "" presents none.
func (c *controlPlane) client(t *testing.T, ca *pki.CA, cn string, groups ...string) *http.Client {
	t.Helper()
	cfg := &tls.Config{RootCAs: c.set.CA.CertPool()}
	if cn != "" {
		if ca == nil {
			ca = c.set.CA
		}
		kp, err := ca.Issue(pki.CertRequest{CommonName: cn, Organizations: groups, Usages: []pki.Usage{pki.ClientAuth}})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{kp.TLSCertificate()}
	}
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: cfg}}
}

// line is one JSON line of the contract.
func line(ts time.Time, fields map[string]string) string {
	m := map[string]string{"_time": ts.UTC().Format(time.RFC3339Nano)}
	for k, v := range fields {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// post sends lines to the gateway and returns the status and body.
func (c *controlPlane) post(t *testing.T, cl *http.Client, query, body string, gz bool) (int, string) {
	t.Helper()
	var r io.Reader = strings.NewReader(body)
	if gz {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write([]byte(body))
		zw.Close()
		r = &b
	}
	req, err := http.NewRequest(http.MethodPost, c.gw+"/insert/jsonline"+query, r)
	if err != nil {
		t.Fatal(err)
	}
	if gz {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(msg)
}
