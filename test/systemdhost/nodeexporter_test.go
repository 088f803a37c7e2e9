//go:build linux

package systemdhost

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/metricsauth"
	"github.com/gpurack/gpurack/agent/nodeexporter"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/test/rigimage"
)

// TestNodeExporterService boots the node image with systemd as PID 1, lays out what
// gpuagent writes after a join (agent/nodeexporter: the web configuration, a serving
// certificate, the cluster CA, the listen address) and starts the image's
// node-exporter.service as the agent does: node_exporter runs as a dynamic user with
// the files handed over by LoadCredential, answers the monitoring certificate (the
// cluster CA's, with the gpurack-monitoring SAN) with the node's series, and refuses a
// client without a certificate or with one lacking the SAN.
func TestNodeExporterService(t *testing.T) {
	requireHost(t)
	bins := rigimage.BuildBinaries(t)
	image, _ := nodeImage(t, bins)
	env := netnstest.New(t)
	ns, cli := env.Namespace(), env.Namespace()
	nic, peer := env.Veth(ns, cli)
	env.AddAddr(nic, gpubootAddr+"/24")
	env.AddAddr(peer, clientAddr+"/24")
	c := bootContainer(t, bootSpec{rootfs: image + "/rootfs.squashfs", dir: t.TempDir(), ns: ns})

	ca, err := pki.NewCA(pki.CARequest{CommonName: "test cluster CA"})
	if err != nil {
		t.Fatal(err)
	}
	serving, err := metricsauth.ServingCert("gpurack-node", []string{"gpurack-node"}, []net.IP{net.ParseIP(gpubootAddr)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	files := c.path(nodeexporter.DefaultDir)
	if err := nodeexporter.Write(files, nodeexporter.Files{ClusterCAPEM: pki.EncodeCertPEM(ca.Cert), Serving: serving,
		AllowedSANs: []string{metricsauth.MonitoringSAN}}); err != nil {
		t.Fatal(err)
	}
	c.run("systemctl", "restart", nodeexporter.Unit)
	p := c.waitUnit(nodeexporter.Unit, "active (running)", startLimit, func(p map[string]string) bool {
		return p["ActiveState"] == "active" && p["SubState"] == "running"
	}, "ActiveState", "SubState", "MainPID", "DynamicUser")

	monitoring := issueClient(t, ca, "gpurack:monitoring", metricsauth.MonitoringSAN)
	other := issueClient(t, ca, "gpurack:monitoring")
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		body, err = scrapeIn(cli, "https://"+gpubootAddr+":9100/metrics", &monitoring)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil || !strings.Contains(body, "node_cpu_seconds_total") || !strings.Contains(body, "node_filesystem_avail_bytes") {
		t.Fatalf("node_exporter with the monitoring certificate: %v; want the node's CPU and filesystem series (%d bytes)\n%s", err, len(body), c.run("journalctl", "-u", nodeexporter.Unit, "--no-pager", "-n", "30"))
	}
	for name, cert := range map[string]*tls.Certificate{"no certificate": nil, "a certificate without the SAN": &other} {
		if _, err := scrapeIn(cli, "https://"+gpubootAddr+":9100/metrics", cert); err == nil {
			t.Errorf("node_exporter answered a client with %s", name)
		}
	}
	status := procStatus(t, c, p["MainPID"])
	if uid := strings.Fields(status["Uid"]); len(uid) == 0 || uid[0] == "0" || status["CapEff"] != "0000000000000000" {
		t.Errorf("node_exporter (pid %s): Uid %q, CapEff %q; want a dynamic user's, no capabilities", p["MainPID"], status["Uid"], status["CapEff"])
	}
	t.Logf("node-exporter.service: pid %s, uid %s, no capabilities; answered the monitoring certificate with %d bytes of series, refused no certificate and one without the SAN", p["MainPID"], strings.Fields(status["Uid"] + " ?")[0], len(body))
}

// issueClient issues a client certificate from ca with cn and the DNS SANs.
func issueClient(t *testing.T, ca *pki.CA, cn string, sans ...string) tls.Certificate {
	t.Helper()
	kp, err := ca.Issue(pki.CertRequest{CommonName: cn, DNSNames: sans, Usages: []pki.Usage{pki.ClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	return kp.TLSCertificate()
}

// scrapeIn GETs url from the network namespace ns over TLS (the serving certificate is
// self-signed, as the metrics server takes it), presenting cert when not nil.
func scrapeIn(ns, url string, cert *tls.Certificate) (string, error) {
	cfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // node_exporter's serving certificate is self-signed by design (decision 0693)
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg,
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			err = netnstest.InNamespace(ns, func() error {
				var derr error
				conn, derr = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
				return derr
			})
			return conn, err
		}}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if resp.StatusCode != http.StatusOK {
		return string(b), &httpError{resp.StatusCode}
	}
	return string(b), err
}

type httpError struct{ code int }

func (e *httpError) Error() string { return http.StatusText(e.code) }
