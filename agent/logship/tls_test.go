package logship

import (
	"bufio"
	"compress/gzip"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/retry"
	"github.com/gpurack/gpurack/internal/pki"
)

// gateway is a TLS server on loopback that, like the log gateway, demands a client
// certificate from the cluster CA and records who sent which lines.
type gateway struct {
	mu      sync.Mutex
	serials map[string]bool
	lines   []record
	names   []string
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	leaf := r.TLS.PeerCertificates[0]
	zr, err := gzip.NewReader(r.Body)
	if err != nil || r.Header.Get("Content-Encoding") != "gzip" || r.URL.Path != "/insert/jsonline" || r.URL.Query().Get("_msg_field") != "_msg" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(nil, 1<<20)
	g.mu.Lock()
	defer g.mu.Unlock()
	for sc.Scan() {
		var rec record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		g.lines = append(g.lines, rec)
		g.names = append(g.names, leaf.Subject.CommonName+"/"+leaf.Subject.Organization[0])
	}
	g.serials[leaf.SerialNumber.String()] = true
	w.Header().Set("Connection", "close") // the next batch handshakes again
}

func (g *gateway) snapshot() ([]record, []string, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]record(nil), g.lines...), append([]string(nil), g.names...), len(g.serials)
}

// writeKubeletCert writes a node client certificate the way kubelet keeps it: the
// certificate and key in one PEM file.
func writeKubeletCert(t *testing.T, ca *pki.CA, path string) {
	kp, err := ca.Issue(pki.CertRequest{CommonName: "system:node:gpu-r1-07", Organizations: []string{"system:nodes"}, Usages: []pki.Usage{pki.ClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.EncodeKeyPEM(kp.Key)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(pki.EncodeCertPEM(kp.Cert), key...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // as kubelet moves its symlink
		t.Fatal(err)
	}
}

// The shipper presents kubelet's node certificate (made by the project's PKI code) to a
// TLS server that checks it against the cluster CA, verifies the server with the
// cluster CA, keeps lines while its certificate is refused, and takes a rotated
// certificate without a restart.
func TestClientTLSWithNodeCertificate(t *testing.T) {
	clusterCA, err := pki.NewCA(pki.CARequest{CommonName: "kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	otherCA, _ := pki.NewCA(pki.CARequest{CommonName: "not the cluster"})
	srvKP, err := clusterCA.Issue(pki.CertRequest{CommonName: "logs-gateway", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usages: []pki.Usage{pki.ServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	g := &gateway{serials: map[string]bool{}}
	srv := httptest.NewUnstartedServer(g)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{srvKP.TLSCertificate()}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clusterCA.CertPool()}
	srv.StartTLS()
	defer srv.Close()

	certFile := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
	writeKubeletCert(t, otherCA, certFile) // not the cluster's: refused
	tlsCfg, err := ClientTLS(certFile, pki.EncodeCertPEM(clusterCA.Cert))
	if err != nil {
		t.Fatal(err)
	}
	pods := podsTree{t: t, root: t.TempDir()}
	p := pods.path("ml", "train-0", "worker")
	pods.write(p, "stdout F epoch 1")
	m := &Metrics{}
	runShipper(t, Config{URL: srv.URL, TLS: tlsCfg, Node: "gpu-r1-07", PodsDir: pods.root, PollEvery: 50 * time.Millisecond,
		FlushEvery: 50 * time.Millisecond, Metrics: m, Backoff: retry.Backoff{First: 50 * time.Millisecond, Max: 200 * time.Millisecond}})
	waitFor(t, "a refused send", func() bool { return m.SendErrors() >= 2 })
	if lines, _, _ := g.snapshot(); len(lines) != 0 || m.Dropped(DropQueueFull)+m.Dropped(DropRejected) != 0 {
		t.Fatalf("with a certificate of another CA: %d lines arrived, %d dropped", len(lines), m.Dropped(DropRejected))
	}
	writeKubeletCert(t, clusterCA, certFile) // kubelet's bootstrap finished
	waitFor(t, "the kept line shipped", func() bool { lines, _, _ := g.snapshot(); return len(lines) == 1 })
	writeKubeletCert(t, clusterCA, certFile) // rotated
	pods.write(p, "stdout F epoch 2")
	waitFor(t, "the second line shipped", func() bool { lines, _, _ := g.snapshot(); return len(lines) == 2 })
	lines, names, serials := g.snapshot()
	if lines[0].Msg != "epoch 1" || lines[1].Msg != "epoch 2" || lines[0].Pod != "train-0" || lines[0].Node != "gpu-r1-07" {
		t.Errorf("lines %+v", lines)
	}
	if names[0] != "system:node:gpu-r1-07/system:nodes" || serials != 2 {
		t.Errorf("client certificates %v, %d serials; want the node's, and the rotated one for the second batch", names, serials)
	}
}

// A server whose certificate the cluster CA did not issue gets nothing.
func TestClientTLSRefusesAnotherServer(t *testing.T) {
	clusterCA, _ := pki.NewCA(pki.CARequest{CommonName: "kubernetes"})
	otherCA, _ := pki.NewCA(pki.CARequest{CommonName: "impostor"})
	srvKP, _ := otherCA.Issue(pki.CertRequest{CommonName: "logs-gateway", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usages: []pki.Usage{pki.ServerAuth}})
	g := &gateway{serials: map[string]bool{}}
	srv := httptest.NewUnstartedServer(g)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{srvKP.TLSCertificate()}}
	srv.StartTLS()
	defer srv.Close()
	certFile := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
	writeKubeletCert(t, clusterCA, certFile)
	tlsCfg, _ := ClientTLS(certFile, pki.EncodeCertPEM(clusterCA.Cert))
	s := newSender(srv.URL, tlsCfg, "gpu-r1-07", "")
	err := s.send(t.Context(), []Entry{{Msg: "secret", Source: "journal", Time: time.Now()}})
	if err == nil {
		t.Fatal("sent to a server the cluster CA did not issue")
	}
	if _, err := ClientTLS(certFile, []byte("no pem")); err == nil {
		t.Error("ClientTLS took a CA bundle without a certificate")
	}
}
