package logsgateway

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
)

// servedGateway runs a Gateway with TLS (certificates of a fresh CA) on loopback in
// front of upstream, and returns its URL and a client function for a CN.
func servedGateway(t *testing.T, cfg Config) (string, func(cn string, orgs ...string) *http.Client) {
	t.Helper()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "test cluster CA"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(pki.CertRequest{CommonName: "gw", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usages: []pki.Usage{pki.ServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, TLSConfig(srv.TLSCertificate(), ca.CertPool()), New(cfg)) }()
	t.Cleanup(func() { cancel(); <-done })
	client := func(cn string, orgs ...string) *http.Client {
		kp, err := ca.Issue(pki.CertRequest{CommonName: cn, Organizations: orgs, Usages: []pki.Usage{pki.ClientAuth}})
		if err != nil {
			t.Fatal(err)
		}
		tc := &tls.Config{RootCAs: ca.CertPool(), Certificates: []tls.Certificate{kp.TLSCertificate()}}
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	}
	return "https://" + ln.Addr().String(), client
}

func post(t *testing.T, c *http.Client, url string, body []byte, enc string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+InsertPath, bytes.NewReader(body))
	if enc != "" {
		req.Header.Set("Content-Encoding", enc)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestGatewayBounds: a node's third request while two are held is 429 at once; a
// request past MaxConcurrent waits QueueWait and is 429; a gzip body that inflates past
// DecodedFactor times the bound is 413 and never reaches the store; the store's own
// refusal comes back as 400, its absence as 502.
func TestGatewayBounds(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var stored [][]byte
	store := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "hold") {
			<-release
		}
		if strings.Contains(string(b), "unparsable") {
			http.Error(w, "cannot parse", http.StatusBadRequest)
			return
		}
		mu.Lock()
		stored = append(stored, b)
		mu.Unlock()
	}))
	defer store.Close()
	defer close(release)
	url, client := servedGateway(t, Config{Upstream: store.URL, MaxRequestBytes: 64 << 10, MaxConcurrent: 3, MaxPerNode: 2, QueueWait: 200 * time.Millisecond})
	a, b, c := client("system:node:a", NodesGroup), client("system:node:b", NodesGroup), client("system:node:c", NodesGroup)
	var wg sync.WaitGroup
	for _, cl := range []*http.Client{a, a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); post(t, cl, url, []byte(`{"_msg":"hold"}`), "") }()
	}
	time.Sleep(300 * time.Millisecond)
	if code, _ := post(t, a, url, []byte(`{"_msg":"x"}`), ""); code != http.StatusTooManyRequests {
		t.Errorf("node a's third request: %d, want 429", code)
	}
	start := time.Now()
	if code, _ := post(t, c, url, []byte(`{"_msg":"x"}`), ""); code != http.StatusTooManyRequests || time.Since(start) < 150*time.Millisecond {
		t.Errorf("a fourth request in all: %d after %s, want 429 after the queue wait", code, time.Since(start))
	}
	release <- struct{}{}
	release <- struct{}{}
	release <- struct{}{}
	wg.Wait()

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(bytes.Repeat([]byte(`{"_msg":"bomb"}`+"\n"), (DecodedFactor*64<<10)/15+1))
	zw.Close()
	if code, msg := post(t, c, url, gz.Bytes(), "gzip"); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a gzip body over the decoded bound (%d bytes sent): %d %s", gz.Len(), code, msg)
	}
	if code, msg := post(t, c, url, []byte("not gzip"), "gzip"); code != http.StatusBadRequest {
		t.Errorf("a body that is not gzip: %d %s", code, msg)
	}
	if code, _ := post(t, c, url, []byte("unparsable"), ""); code != http.StatusBadRequest {
		t.Errorf("the store's 400: %d", code)
	}
	mu.Lock()
	for _, s := range stored {
		if strings.Contains(string(s), "bomb") {
			t.Error("the gzip bomb reached the store")
		}
	}
	mu.Unlock()
	store.Close()
	if code, _ := post(t, c, url, []byte(`{"_msg":"x"}`), ""); code != http.StatusBadGateway {
		t.Errorf("the store down: %d, want 502", code)
	}
}
