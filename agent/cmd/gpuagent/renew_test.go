package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/joinbundle"
	"github.com/gpurack/gpurack/internal/pki"
)

// TestAgentRenewsWithGpuboot runs the real gpuboot binary with enrollment.agentCertValidity
// of one minute (no cluster; approval auto) and a simulated agent started with --enroll:
// the agent renews its certificate at two thirds of the minute, its mutual-TLS API serves
// the renewed certificate to a new connection, its /metrics and its kept JoinBundle
// follow, and gpuboot still takes its heartbeats after the first certificate expired.
func TestAgentRenewsWithGpuboot(t *testing.T) {
	g := startGpubootWith(t, "policy: {approval: auto}\nenrollment: {allowSimulated: true, agentCertValidity: 1m}\n")
	dir, tlsAddr := g.dir, g.tls
	creds := g.creds
	keyDir, listen, metrics := filepath.Join(dir, "run"), freePort(t), freePort(t)
	const mac = "52:54:00:00:0c:01"
	agent := startDaemon(t, nil, "--gpu-backend", "sim:dgxh100", "--profile", h100Profile,
		"--enroll", tlsAddr, "--enroll-ca", g.pin, "--key-dir", keyDir,
		"--facts-root", e2eFactsRoot(t, mac, "SN-renew"), "--listen", listen, "--metrics-listen", metrics, "--metrics-plaintext",
		"--socket", filepath.Join(dir, "agent.sock"), "--interval", "1s")

	expiry := func() time.Time {
		m := regexp.MustCompile(`(?m)^gpurack_certificate_expiry_timestamp_seconds\{Hostname="[^"]*",component="gpuagent",name="agent"\} (\S+)$`).
			FindStringSubmatch(scrape(metrics))
		if m == nil {
			return time.Time{}
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return time.Unix(int64(v), 0)
	}
	var first time.Time
	waitUntil(t, 90*time.Second, "the agent holds a certificate (expiry on its /metrics)", func() bool { first = expiry(); return !first.IsZero() })
	node := servedCert(t, creds, listen, "").Subject.CommonName
	served := servedCert(t, creds, listen, node)
	if !served.NotAfter.Equal(first) {
		t.Fatalf("the agent's API serves a certificate expiring %s, its /metrics says %s", served.NotAfter, first)
	}

	var renewed time.Time
	waitUntil(t, time.Until(first)+10*time.Second, "a renewed certificate on the agent's /metrics", func() bool {
		renewed = expiry()
		return renewed.After(first)
	})
	if now := servedCert(t, creds, listen, node); !now.NotAfter.Equal(renewed) || now.SerialNumber.Cmp(served.SerialNumber) == 0 {
		t.Errorf("a new connection to the agent's API gets serial %s expiring %s; want the renewed certificate (expiring %s)", now.SerialNumber.Text(16), now.NotAfter, renewed)
	}
	b, err := joinbundle.Load(filepath.Join(keyDir, joinbundle.KeptFile), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if kept, err := pki.DecodeCertPEM([]byte(b.GetAgentCertificatePem())); err != nil || !kept.NotAfter.Equal(renewed) {
		t.Errorf("the kept JoinBundle's certificate: %v; want the renewed one", err)
	}

	// Heartbeats go on after the first certificate expired.
	lastBeat := func() time.Time {
		var list struct {
			Machines []struct {
				LastHeartbeatAt time.Time `json:"lastHeartbeatAt"`
			} `json:"machines"`
		}
		if err := json.Unmarshal([]byte(g.cli("machines", "list", "-o", "json")), &list); err != nil || len(list.Machines) != 1 {
			t.Fatalf("machines list: %v, %d machines", err, len(list.Machines))
		}
		return list.Machines[0].LastHeartbeatAt
	}
	waitUntil(t, time.Until(first)+30*time.Second, "a heartbeat after the first certificate expired", func() bool {
		return lastBeat().After(first.Add(time.Second))
	})
	if !strings.Contains(agent.stderr.String(), "agent certificate renewed") || !strings.Contains(g.log.String(), "agent certificate renewed") {
		t.Errorf("the renewal is not in the agent's log or gpuboot's:\nagent:\n%s", agent.stderr.String())
	}
	t.Logf("node %s: certificate expiring %s renewed to %s; heartbeats went on", node, first.Format(time.TimeOnly), renewed.Format(time.TimeOnly))
}

// servedCert is the certificate the agent's mutual-TLS API at addr presents to an
// operator (credentials in credsDir); with node empty the server name is not checked.
func servedCert(t *testing.T, credsDir, addr, node string) *x509.Certificate {
	t.Helper()
	kp, err := pki.LoadKeyPair(filepath.Join(credsDir, "operator.crt"), filepath.Join(credsDir, "operator.key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(filepath.Join(credsDir, "ca.crt"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cfg := &tls.Config{RootCAs: pool, ServerName: node, NextProtos: []string{"h2"}, Certificates: []tls.Certificate{kp.TLSCertificate()}}
	if node == "" {
		cfg.InsecureSkipVerify = true // only to learn the node name
	}
	var conn *tls.Conn
	waitUntil(t, 60*time.Second, "the agent's mutual-TLS API", func() bool {
		conn, err = tls.Dial("tcp", addr, cfg)
		return err == nil
	})
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// scrape reads the agent's /metrics at addr; "" while it does not answer.
func scrape(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
