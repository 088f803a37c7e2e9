package node

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// The log-shipping service as the join starts it: the bundle's logs endpoint and cluster
// CA, kubelet's client certificate from KUBELET_DIR/pki, a container log under the
// configured pods directory; the line reaches the store as the bundle's node, its
// counters are the ones /metrics serves, and the service stops with its context.
func TestLogShippingService(t *testing.T) {
	clusterCA, err := pki.NewCA(pki.CARequest{CommonName: "kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	srvKP, _ := clusterCA.Issue(pki.CertRequest{CommonName: "gpurack:logs-gateway", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usages: []pki.Usage{pki.ServerAuth}})
	var mu sync.Mutex
	var got []map[string]string
	var who []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sc := bufio.NewScanner(zr)
		mu.Lock()
		defer mu.Unlock()
		for sc.Scan() {
			var rec map[string]string
			json.Unmarshal(sc.Bytes(), &rec)
			got = append(got, rec)
			who = append(who, r.TLS.PeerCertificates[0].Subject.CommonName)
		}
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{srvKP.TLSCertificate()}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clusterCA.CertPool()}
	srv.StartTLS()
	defer srv.Close()

	cfg := simConfig(t)
	cfg.KubeletDir = t.TempDir()
	kp, _ := clusterCA.Issue(pki.CertRequest{CommonName: "system:node:gpu-r1-07", Organizations: []string{"system:nodes"}, Usages: []pki.Usage{pki.ClientAuth}})
	key, _ := pki.EncodeKeyPEM(kp.Key)
	os.MkdirAll(filepath.Join(cfg.KubeletDir, "pki"), 0o700)
	if err := os.WriteFile(filepath.Join(cfg.KubeletDir, "pki", "kubelet-client-current.pem"), append(pki.EncodeCertPEM(kp.Cert), key...), 0o600); err != nil {
		t.Fatal(err)
	}
	pods := t.TempDir()
	dir := filepath.Join(pods, "ml_train-0_6f1c2a8e-0000-4000-8000-000000000001", "worker")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "0.log"), []byte(time.Now().UTC().Format(time.RFC3339Nano)+" stdout F step 1\n"), 0o644)
	cfg.Logs = LogShipping{PodsDir: pods, Journalctl: "off", StateFile: filepath.Join(t.TempDir(), "logship.json")}
	n := &node{cfg: cfg, log: cfg.Log}

	bundle := &bootv1.JoinBundle{NodeName: "gpu-r1-07", ClusterCaPem: string(pki.EncodeCertPEM(clusterCA.Cert)),
		LogsEndpoint: srv.Listener.Addr().String()}
	svc := n.logShipping(bundle)
	if svc == nil || n.logShipping(&bootv1.JoinBundle{NodeName: "gpu-r1-07"}) != nil {
		t.Fatal("log shipping: want a service with a logs endpoint, none without")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.attempt(ctx, gated{}) }()
	deadline := time.Now().Add(20 * time.Second)
	for n.logs.Shipped("container") < 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("attempt: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0]["_msg"] != "step 1" || got[0]["node"] != "gpu-r1-07" || got[0]["pod"] != "train-0" || who[0] != "system:node:gpu-r1-07" {
		t.Fatalf("store got %v from %v", got, who)
	}
	if st := svc.Status(); st.State != Running {
		t.Errorf("status %v", st)
	}
	// /metrics serves these counters.
	if also := n.metricsCollector().Also; !slices.Contains(also, prometheus.Collector(&n.logs)) {
		t.Errorf("the metrics collector does not serve log shipping's counters: %v", also)
	}
}
