package enroll

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
)

// TestRenewTime: renewal falls at two thirds of the lifetime (the backdate does not
// count), moved earlier by at most a thirtieth of it; the backoff between failed tries
// scales with the lifetime, from a few tries per second for seconds-long certificates to
// at most five minutes for a year.
func TestRenewTime(t *testing.T) {
	issued := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, life := range []time.Duration{4 * time.Second, 10 * time.Minute, 365 * 24 * time.Hour} {
		cert := &x509.Certificate{NotBefore: issued.Add(-pki.Backdate), NotAfter: issued.Add(life)}
		latest, earliest := renewTime(cert, 0), renewTime(cert, 1)
		if want := issued.Add(life * 2 / 3); latest.Sub(want).Abs() > time.Millisecond {
			t.Errorf("lifetime %s: renew at %s, want %s", life, latest, want)
		}
		if d := latest.Sub(earliest); d < life/31 || d > life/29 {
			t.Errorf("lifetime %s: jitter spans %s, want a thirtieth (%s)", life, d, life/30)
		}
		b := renewBackoff(life)
		if b.First <= 0 || b.First > time.Second || b.Max < b.First || b.Max > 5*time.Minute || b.Max > life/2 {
			t.Errorf("lifetime %s: backoff %s to %s", life, b.First, b.Max)
		}
	}
	if b := renewBackoff(365 * 24 * time.Hour); b.First != time.Second || b.Max != 5*time.Minute {
		t.Errorf("a year: backoff %s to %s, want 1s to 5m", b.First, b.Max)
	}
}
