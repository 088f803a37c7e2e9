package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	agentenroll "github.com/gpurack/gpurack/agent/enroll"
	"github.com/gpurack/gpurack/agent/joinbundle"
)

// TestAgentRenewsAcrossExpiry runs the agent's own enrollment client and renewal loop
// (agent/enroll) against the service behind real TLS, with agent certificates valid for
// 4 seconds: the agent renews at two thirds of each lifetime and heart-beats over
// mutual TLS every 100 ms, opening a new connection (a full handshake) every few beats,
// for two lifetimes. No heartbeat fails, every one goes over mutual TLS (gpuboot
// answers with its revocation list only then), the bundle's certificate can no longer
// shake hands once it expired, and the machine's record holds each renewed serial.
func TestAgentRenewsAcrossExpiry(t *testing.T) {
	const validity = 4 * time.Second
	e := newEnv(t, func(c *Config) { c.AgentCertValidity = validity; c.Now = time.Now })
	a, first := bundled(e, "52:54:00:00:00:c1")
	creds := &joinbundle.Credentials{Cert: first, Key: a.key, CA: e.ca.Cert}
	c := &agentenroll.Client{Target: agentenroll.Target{Endpoint: e.addr, Pin: e.ca.Pin()}, Key: a.key, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := c.Dial(); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.UseCertificate(creds); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var renewed []*x509.Certificate
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&agentenroll.Renewal{Client: c, Identity: a.facts.Identity, Cert: creds, Log: c.Log,
			Renewed: func(cert *x509.Certificate) { mu.Lock(); renewed = append(renewed, cert); mu.Unlock() }}).Run(ctx)
	}()
	defer func() { cancel(); <-done }()

	end := first.NotAfter.Add(validity)
	beats := 0
	for time.Now().Before(end) {
		resp, err := c.Heartbeat(ctx, agentenroll.HeartbeatFields{Identity: a.facts.Identity, RevocationsDigest: "not the list"})
		if err != nil {
			t.Fatalf("heartbeat %d at %s (bundle certificate expires %s, %d renewals): %v", beats, time.Now().Format(time.StampMilli), first.NotAfter.Format(time.StampMilli), len(renewed), err)
		}
		if resp.GetRevocations() == nil {
			t.Fatalf("heartbeat %d was not authenticated by the agent certificate (no revocation list in the answer)", beats)
		}
		if beats++; beats%5 == 0 {
			if err := c.Reconnect(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	got := slices.Clone(renewed)
	mu.Unlock()
	if len(got) < 2 {
		t.Fatalf("%d renewals in two lifetimes of %s; want at least 2", len(got), validity)
	}
	m := e.machine("52:54:00:00:00:c1")
	for _, cert := range got {
		if !slices.Contains(m.AgentCertSerials, cert.SerialNumber.Text(16)) {
			t.Errorf("renewed serial %s not recorded for the machine (%v)", cert.SerialNumber.Text(16), m.AgentCertSerials)
		}
		if cert.Subject.CommonName != first.Subject.CommonName || !first.PublicKey.(ed25519.PublicKey).Equal(cert.PublicKey) {
			t.Errorf("renewed certificate %s for %v, want node %s and the same key", cert.SerialNumber.Text(16), cert.Subject, first.Subject.CommonName)
		}
	}
	if _, err := a.heartbeat(e.client(tls.Certificate{Certificate: [][]byte{first.Raw}, PrivateKey: a.key, Leaf: first}), false); err == nil {
		t.Error("a heartbeat with the expired bundle certificate was accepted")
	}
	t.Logf("%d heartbeats, %d renewals over two lifetimes of %s; bundle certificate expired %s", beats, len(got), validity, first.NotAfter.Format(time.StampMilli))
}
