package pki

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// serveTLS accepts connections on a loopback listener with cfg; each
// handshake's result is sent on the returned channel, and a connection whose
// handshake succeeded gets "ok\n".
func serveTLS(t *testing.T, cfg *tls.Config) (string, <-chan error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	results := make(chan error, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				err := c.(*tls.Conn).Handshake()
				if err == nil {
					_, err = io.WriteString(c, "ok\n")
				}
				results <- err
			}()
		}
	}()
	return ln.Addr().String(), results
}

// dialTLS connects, completes the handshake and reads the server's "ok".
// Reading matters: under TLS 1.3 a client's handshake completes before the
// server has checked the client certificate, and the refusal arrives as an
// alert on the first read.
func dialTLS(addr string, cfg *tls.Config) (tls.ConnectionState, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 3)
	if _, err := io.ReadFull(c, buf); err != nil {
		return c.ConnectionState(), err
	}
	if string(buf) != "ok\n" {
		return c.ConnectionState(), errors.New("unexpected reply " + string(buf))
	}
	return c.ConnectionState(), nil
}

func serverResult(t *testing.T, results <-chan error) error {
	t.Helper()
	select {
	case err := <-results:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("server did not finish the handshake")
		return nil
	}
}

// TestPinnedHandshake runs ClientConfigPinned against real TLS servers on
// loopback, presenting good and bad chains.
func TestPinnedHandshake(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	evil := newTestCA(t, "gpurack CA")
	must := mustIssue(t)
	server := must(IssueServer(ca, []string{"gpuboot.test", "127.0.0.1"}))
	evilServer := must(IssueServer(evil, []string{"gpuboot.test", "127.0.0.1"}))
	agent := must(IssueAgent(ca, "node-1", []net.IP{net.ParseIP("127.0.0.1")}))

	tests := []struct {
		name       string
		serverCert tls.Certificate
		pin        string
		serverName string
		err        string // substring of the client's error; "" means success
	}{
		{"right pin, by IP", server.TLSCertificate(ca.Cert), ca.Pin(), "", ""},
		{"right pin, by name", server.TLSCertificate(ca.Cert), ca.Pin(), "gpuboot.test", ""},
		{"right pin, name not in certificate", server.TLSCertificate(ca.Cert), ca.Pin(), "other.test", "does not verify"},
		{"wrong pin", server.TLSCertificate(ca.Cert), evil.Pin(), "", "pinned key"},
		{"server omits CA from chain", server.TLSCertificate(), ca.Pin(), "", "pinned key"},
		{"impostor leaf with the real CA in its chain", evilServer.TLSCertificate(ca.Cert), ca.Pin(), "", "does not verify"},
		{"impostor CA and leaf", evilServer.TLSCertificate(evil.Cert), ca.Pin(), "", "pinned key"},
		{"agent certificate posing as gpuboot", agent.TLSCertificate(ca.Cert), ca.Pin(), "", "role"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, results := serveTLS(t, &tls.Config{Certificates: []tls.Certificate{tt.serverCert}})
			cfg := ClientConfigPinned(tt.pin)
			cfg.ServerName = tt.serverName
			_, err := dialTLS(addr, cfg)
			serverErr := serverResult(t, results)
			if tt.err == "" {
				if err != nil || serverErr != nil {
					t.Fatalf("client: %v; server: %v", err, serverErr)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("client err = %v, want one containing %q", err, tt.err)
			}
			if serverErr == nil {
				t.Errorf("server saw a completed handshake")
			}
		})
	}
}

func TestClientConfigPinnedMalformedPin(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	server := mustIssue(t)(IssueServer(ca, []string{"127.0.0.1"}))
	addr, results := serveTLS(t, &tls.Config{Certificates: []tls.Certificate{server.TLSCertificate(ca.Cert)}})
	_, err := dialTLS(addr, ClientConfigPinned("sha256:nothex"))
	if err == nil || !strings.Contains(err.Error(), "hex digits") {
		t.Errorf("err = %v", err)
	}
	serverResult(t, results)
}

// revocationServer is gpuboot's side after the JoinBundle: mTLS requiring a
// client certificate from the CA, consulting rl with the given hook.
func revocationServer(t *testing.T, ca *CA, rl *RevocationList, useVerifyConnection bool) (string, <-chan error) {
	server := mustIssue(t)(IssueServer(ca, []string{"127.0.0.1"}))
	cfg := &tls.Config{
		Certificates: []tls.Certificate{server.TLSCertificate(ca.Cert)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.CertPool(),
	}
	if useVerifyConnection {
		cfg.VerifyConnection = rl.VerifyConnection
	} else {
		cfg.VerifyPeerCertificate = rl.VerifyPeerCertificate
	}
	return serveTLS(t, cfg)
}

func TestRevokedClientRefused(t *testing.T) {
	for _, hook := range []string{"VerifyConnection", "VerifyPeerCertificate"} {
		t.Run(hook, func(t *testing.T) {
			ca := newTestCA(t, "gpurack CA")
			must := mustIssue(t)
			agent := must(IssueAgent(ca, "node-1", nil))
			other := must(IssueAgent(ca, "node-2", nil))
			rl := NewRevocationList(other.Cert.SerialNumber)
			addr, results := revocationServer(t, ca, rl, hook == "VerifyConnection")
			client := ClientConfigPinned(ca.Pin())
			client.Certificates = []tls.Certificate{agent.TLSCertificate()}

			if _, err := dialTLS(addr, client); err != nil {
				t.Fatalf("before revocation: %v", err)
			}
			if err := serverResult(t, results); err != nil {
				t.Fatalf("server before revocation: %v", err)
			}

			rl.Revoke(agent.Cert.SerialNumber)
			client = ClientConfigPinned(ca.Pin()) // fresh: no session to resume
			client.Certificates = []tls.Certificate{agent.TLSCertificate()}
			if _, err := dialTLS(addr, client); err == nil {
				t.Errorf("client completed an exchange with a revoked certificate")
			}
			err := serverResult(t, results)
			if err == nil || !strings.Contains(err.Error(), "revoked") {
				t.Errorf("server err = %v, want one saying the certificate is revoked", err)
			}
		})
	}
}

// TestRevocationOnResumption shows why VerifyConnection is the hook to use:
// a client revoked after its first handshake can resume its TLS session, and
// Go skips VerifyPeerCertificate on resumption.
func TestRevocationOnResumption(t *testing.T) {
	for _, tt := range []struct {
		hook      string
		wantAdmit bool
	}{
		{"VerifyPeerCertificate", true},
		{"VerifyConnection", false},
	} {
		t.Run(tt.hook, func(t *testing.T) {
			ca := newTestCA(t, "gpurack CA")
			agent := mustIssue(t)(IssueAgent(ca, "node-1", nil))
			rl := NewRevocationList()
			addr, results := revocationServer(t, ca, rl, tt.hook == "VerifyConnection")
			client := ClientConfigPinned(ca.Pin())
			client.Certificates = []tls.Certificate{agent.TLSCertificate()}
			client.ClientSessionCache = tls.NewLRUClientSessionCache(4)

			if _, err := dialTLS(addr, client); err != nil {
				t.Fatalf("first connection: %v", err)
			}
			if err := serverResult(t, results); err != nil {
				t.Fatalf("server, first connection: %v", err)
			}
			rl.Revoke(agent.Cert.SerialNumber)
			cs, err := dialTLS(addr, client)
			serverErr := serverResult(t, results)
			admitted := err == nil && serverErr == nil
			if admitted != tt.wantAdmit {
				t.Errorf("revoked client admitted=%v (resumed=%v), want %v; client: %v; server: %v", admitted, cs.DidResume, tt.wantAdmit, err, serverErr)
			}
			if admitted && !cs.DidResume {
				t.Errorf("the second connection did not resume, so this test shows nothing")
			}
		})
	}
}
