package controlplane

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestCheckClockRefusesSkew: a joining host whose clock is an hour ahead of, or 10
// minutes behind, the API server's Date is refused with the skew and what to fix; one a
// minute off is taken.
func TestCheckClockRefusesSkew(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusUnauthorized) // any answer carries the Date
	}))
	defer srv.Close()
	server := strings.TrimPrefix(srv.URL, "https://")
	for _, c := range []struct {
		off  time.Duration
		want string
	}{
		{time.Hour, "1h0m0s ahead of"},
		{-10 * time.Minute, "10m0s behind"},
		{time.Minute, ""},
		{-time.Minute, ""},
	} {
		err := checkClock(context.Background(), server, func() time.Time { return time.Now().Add(c.off) })
		switch {
		case c.want == "" && err != nil:
			t.Errorf("a clock %s off: %v; want taken", c.off, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "time sync")):
			t.Errorf("a clock %s off: %v; want refused, saying %q and what to fix", c.off, err, c.want)
		}
	}
}
