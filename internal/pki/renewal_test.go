package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"
)

// TestRenewAt: a certificate issued for a validity V is valid for V from its issue
// (the backdate does not count), and is due for renewal once the given share of V has
// passed; CertifyAgentFor's validity is the one asked for.
func TestRenewAt(t *testing.T) {
	ca, err := NewCA(CARequest{CommonName: "test CA"})
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	for _, v := range []time.Duration{3 * time.Second, 5 * time.Minute, DefaultLeafValidity} {
		before := time.Now().Truncate(time.Second)
		cert, err := CertifyAgentFor(ca, "gpu-r1-u01", nil, pub, v)
		if err != nil {
			t.Fatal(err)
		}
		if got := Lifetime(cert); got != v {
			t.Errorf("validity %s: lifetime %s", v, got)
		}
		if issued := Issued(cert); issued.Before(before) || issued.After(time.Now()) {
			t.Errorf("validity %s: issued %s, want about now (%s)", v, issued, before)
		}
		if got, want := RenewAt(cert, 2.0/3), Issued(cert).Add(v*2/3); got.Sub(want).Abs() > time.Millisecond {
			t.Errorf("validity %s: renew at %s, want %s", v, got, want)
		}
	}
	// A certificate whose NotBefore is later than NotAfter minus the backdate (not one
	// this package makes) reads as issued at NotAfter: due at once.
	cert, _ := CertifyAgentFor(ca, "gpu-r1-u01", nil, pub, time.Minute)
	cert.NotBefore = cert.NotAfter.Add(-time.Second)
	if !Issued(cert).Equal(cert.NotAfter) || Lifetime(cert) != 0 || !RenewAt(cert, 2.0/3).Equal(cert.NotAfter) {
		t.Errorf("issued %s, lifetime %s for a certificate valid one second", Issued(cert), Lifetime(cert))
	}
}
